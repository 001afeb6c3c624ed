/**
 * Cell edits the agent proposes (`edit_cell`, SPEC §18), shown as a diff on the cell with
 * `accept-edit` and `reject-edit`.
 *
 * The kernel sends each proposal as an `edit_cell` message on the `soba_nb.monitor` comm
 * (`{"type": "edit_cell", "call", "executionCount", "cellId", "old", "new", "turn"}`). Like the
 * proposed cells (`cells.ts`), the plugin reads them from the notebook's iopub and acts on
 * those whose request came from this page. The diff is text (`textContent`), never HTML.
 *
 * Accept replaces the cell's source (it is not run); reject leaves it. Either way the
 * decision goes to the kernel's inbox through the Jupyter server — the turn may still be
 * running, and a busy kernel does not read its shell channel — and, when the kernel is idle,
 * a `{"type": "inbox"}` request makes it take the decision at once: each decision is an entry,
 * and the model reads it at its next request. A cell the user changed since the proposal is
 * not overwritten: the proposal is then rejected, and the panel says why.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { Cell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { KernelMessage } from '@jupyterlab/services';

import { sendControl } from './controls';
import { ownCommData } from './messages';
import { lineDiff } from './diff';
import { sendToInbox } from './serverapi';
import { el } from './dom';

/** An edit the agent proposed. */
export interface IEditCell {
  type: 'edit_cell';
  call: string;
  executionCount: number | null;
  cellId: string | null;
  old: string;
  new: string;
  turn: string;
}

type Fields = Record<string, unknown>;

/** The edit in a comm payload, or null when the payload is not one. */
export function parseEditCell(data: unknown): IEditCell | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const f = data as Fields;
  const count = f.executionCount;
  const ok =
    f.type === 'edit_cell' &&
    typeof f.call === 'string' &&
    typeof f.old === 'string' &&
    typeof f.new === 'string' &&
    (count === null || count === undefined || Number.isInteger(count)) &&
    (f.cellId === null || f.cellId === undefined || typeof f.cellId === 'string');
  if (!ok) {
    return null;
  }
  return {
    type: 'edit_cell',
    call: f.call as string,
    executionCount: (count as number | undefined) ?? null,
    cellId: (f.cellId as string | undefined) ?? null,
    old: f.old as string,
    new: f.new as string,
    turn: typeof f.turn === 'string' ? f.turn : ''
  };
}

const CHANGED_SINCE = 'the cell changed since this edit was proposed: not applied (rejected)';

/** The diff box on a cell: the changed lines and the two buttons. */
function diffBox(edit: IEditCell, decide: (accepted: boolean) => void): HTMLElement {
  const box = el('div', 'soba-Edit');
  box.dataset.sobaRole = 'edit-diff';
  box.dataset.sobaCall = edit.call;
  box.setAttribute('role', 'group');
  const label = edit.executionCount !== null ? `In [${edit.executionCount}]` : 'this cell';
  box.setAttribute('aria-label', `soba proposes an edit of ${label}`);
  box.append(el('div', 'soba-Edit-title', `soba proposes an edit of ${label} (not run when accepted):`));
  const pre = el('pre', 'soba-Edit-diff');
  for (const line of lineDiff(edit.old, edit.new)) {
    const node = el('span', 'soba-Edit-line', `${line.op} ${line.text}\n`);
    node.dataset.op = line.op === ' ' ? 'same' : line.op === '-' ? 'removed' : 'added';
    pre.append(node);
  }
  const accept = el('button', 'soba-Edit-accept jp-Button', 'Accept') as HTMLButtonElement;
  accept.dataset.sobaRole = 'accept-edit';
  accept.title = 'Replace the cell source with the proposal (not run)';
  const reject = el('button', 'soba-Edit-reject jp-Button', 'Reject') as HTMLButtonElement;
  reject.dataset.sobaRole = 'reject-edit';
  reject.title = 'Keep the cell as it is; the model is told';
  for (const [node, accepted] of [
    [accept, true],
    [reject, false]
  ] as const) {
    node.type = 'button';
    node.addEventListener('click', () => decide(accepted));
  }
  const buttons = el('div', 'soba-Edit-buttons');
  buttons.append(accept, reject);
  box.append(pre, buttons);
  return box;
}

export class EditReviewer {
  constructor(private readonly _tracker: INotebookTracker) {
    _tracker.forEach(panel => this._follow(panel));
    _tracker.widgetAdded.connect((_, panel) => this._follow(panel), this);
  }

  private readonly _contexts = new WeakSet<ISessionContext>();
  /** Proposals shown, by call id (a message that arrives on two comms is shown once). */
  private readonly _shown = new Set<string>();

  private _follow(panel: NotebookPanel): void {
    const context = panel.sessionContext;
    if (this._contexts.has(context)) {
      return;
    }
    this._contexts.add(context);
    context.iopubMessage.connect(this._onIOPub, this);
  }

  private _onIOPub(context: ISessionContext, msg: KernelMessage.IMessage): void {
    const edit = parseEditCell(ownCommData(context, msg));
    if (!edit || this._shown.has(edit.call)) {
      return;
    }
    const panel = this._tracker.find(widget => widget.sessionContext === context);
    const cell = panel && this._cellOf(panel, edit);
    if (panel && cell) {
      this._shown.add(edit.call);
      this._show(panel, cell, edit);
    }
  }

  private _cellOf(panel: NotebookPanel, edit: IEditCell): Cell | undefined {
    const cells = panel.content.widgets;
    const byId = edit.cellId !== null ? cells.find(cell => cell.model.id === edit.cellId) : undefined;
    if (byId) {
      return byId;
    }
    // The newest cell run with that count (a count is unique per kernel run).
    return [...cells]
      .reverse()
      .find(
        cell =>
          cell.model.type === 'code' &&
          (cell.model as unknown as { executionCount: number | null }).executionCount ===
            edit.executionCount
      );
  }

  private _show(panel: NotebookPanel, cell: Cell, edit: IEditCell): void {
    cell.node.querySelector(`.soba-Edit[data-soba-call="${CSS.escape(edit.call)}"]`)?.remove();
    const box = diffBox(edit, accepted => void this._decide(panel, cell, edit, box, accepted));
    const input = cell.node.querySelector('.jp-Cell-inputWrapper');
    cell.node.insertBefore(box, input);
  }

  private async _decide(
    panel: NotebookPanel,
    cell: Cell,
    edit: IEditCell,
    box: HTMLElement,
    accepted: boolean
  ): Promise<void> {
    let decision: 'accepted' | 'rejected' = accepted ? 'accepted' : 'rejected';
    let note = accepted ? 'edit accepted: the cell holds the proposal (not run)' : 'edit rejected';
    if (accepted) {
      if (cell.model.sharedModel.getSource() !== edit.old) {
        decision = 'rejected';
        note = CHANGED_SINCE;
      } else {
        cell.model.sharedModel.setSource(edit.new);
      }
    }
    box.querySelectorAll('button').forEach(button => ((button as HTMLButtonElement).disabled = true));
    const status = el('div', 'soba-Edit-status', note);
    status.setAttribute('role', 'status');
    try {
      await sendToInbox(panel.context.path, {
        kind: 'edit',
        call: edit.call,
        executionCount: edit.executionCount,
        decision
      });
      const kernel = panel.sessionContext.session?.kernel;
      if (kernel && kernel.status === 'idle') {
        await sendControl(kernel, { type: 'inbox' });
      }
    } catch (reason) {
      status.textContent = `${note} · the kernel was not told: ${reason instanceof Error ? reason.message : String(reason)}`;
    }
    box.replaceChildren(status);
    window.setTimeout(() => box.remove(), decision === 'accepted' ? 4000 : 8000);
  }
}

export const cellEdits: JupyterFrontEndPlugin<void> = {
  id: 'soba-nb-labextension:edit-cell',
  description: 'Cell edits the soba agent proposes (edit_cell), shown as a diff to accept or reject.',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker): void => {
    new EditReviewer(tracker);
  }
};
