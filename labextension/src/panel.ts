/**
 * The "soba budget" sidebar panel: plain DOM in a Lumino widget, redrawn from the store.
 *
 * Shows, for the current notebook, effective tokens against hardLimit as a bar with the soft
 * threshold marked, the measurement source, auto on/off, the last compaction's result line,
 * the last attempt's (when the latest operation did not complete), the heads-up when an
 * automatic compaction is near (`data-soba-role="compaction-heads-up"`), and during a barrier the
 * live line the kernel sends (`Compacting context before response · NN%`, or
 * `Compacting context · NN%` for `%compact`) — the same words as in the cell.
 *
 * It is also a control: Compact now, Auto-compact on/off, Cancel (interrupts the kernel)
 * and Export capsule…. The buttons are built once and only their state changes, so a
 * redraw during a barrier never swallows a click.
 */

import { InputDialog } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { IRenderMimeRegistry } from '@jupyterlab/rendermime';

import { ChatController } from './chat';
import { ChatView } from './chatview';
import { capsuleFileName } from './controls';
import { ISnapshot } from './messages';
import { BudgetStore, IBudgetState } from './store';
import { el } from './dom';

export const PANEL_ID = 'soba-budget-panel';
export const PANEL_TITLE = 'soba';
export const PANEL_CAPTION = 'soba: the conversation and the context budget of this notebook';
export const NO_NOTEBOOK = 'Open a notebook to see its context budget.';
export const NO_DATA = 'Run %budget or %soba in this notebook';
/** The public name (`data-soba-role`, SPEC §18) of the heads-up before an automatic compaction. */
export const HEADS_UP_ROLE = 'compaction-heads-up';

const PERCENT = 100;
const SOURCE_LABELS: Record<string, string> = {
  provider_usage: 'provider usage',
  estimated: 'estimated'
};

/** Thousands separators as Python's `f"{n:,}"` writes them, whatever the browser locale. */
export const tokens = (count: number): string => count.toLocaleString('en-US');

/** `ok` below the soft threshold, `soft` from it, `hard` over the hard limit (SPEC §6:
 * the `hard_limit` trigger fires when effective > hardLimit), as `%budget` does. */
export function level(snapshot: ISnapshot): 'ok' | 'soft' | 'hard' {
  if (snapshot.effective > snapshot.hardLimit) {
    return 'hard';
  }
  return snapshot.effective >= snapshot.softLimit ? 'soft' : 'ok';
}

const share = (part: number, whole: number): number =>
  whole > 0 ? Math.min(PERCENT, Math.max(0, (PERCENT * part) / whole)) : 0;

function bar(snapshot: ISnapshot): HTMLElement {
  const meter = el('div', 'soba-Budget-bar');
  meter.setAttribute('role', 'meter');
  meter.setAttribute('aria-label', 'effective tokens against the hard limit');
  meter.setAttribute('aria-valuemin', '0');
  meter.setAttribute('aria-valuemax', String(snapshot.hardLimit));
  meter.setAttribute('aria-valuenow', String(snapshot.effective));
  const fill = el('div', 'soba-Budget-fill');
  fill.dataset.level = level(snapshot);
  fill.style.width = `${share(snapshot.effective, snapshot.hardLimit)}%`;
  const softMarker = el('div', 'soba-Budget-softMarker');
  softMarker.style.left = `${share(snapshot.softLimit, snapshot.hardLimit)}%`;
  softMarker.title = `soft threshold ${tokens(snapshot.softLimit)}`;
  meter.append(fill, softMarker);
  return meter;
}

function row(label: string, value: string, className = ''): HTMLElement {
  const line = el('div', `soba-Budget-row ${className}`.trim());
  line.append(el('span', 'soba-Budget-label', label), el('span', 'soba-Budget-value', value));
  return line;
}

function figures(snapshot: ISnapshot): HTMLElement[] {
  const used = Math.round(share(snapshot.effective, snapshot.hardLimit));
  return [
    el(
      'div',
      'soba-Budget-figures',
      `${tokens(snapshot.effective)} / ${tokens(snapshot.hardLimit)} tokens · ${used}%`
    ),
    bar(snapshot),
    el(
      'div',
      'soba-Budget-legend',
      `soft threshold ${tokens(snapshot.softLimit)} · hard limit ${tokens(snapshot.hardLimit)}`
    ),
    row('source', SOURCE_LABELS[snapshot.source] ?? snapshot.source, 'soba-Budget-source'),
    row('auto-compact', snapshot.auto ? 'on' : 'off', 'soba-Budget-auto'),
    ...(snapshot.provider ? [row('provider', snapshot.provider)] : []),
    ...(snapshot.session ? [row('session', snapshot.session)] : []),
    // The kernel's words, as `%budget` shows them (SPEC §11).
    ...(snapshot.cost ? [el('div', 'soba-Budget-cost', snapshot.cost)] : [])
  ];
}

function outcome(className: string, label: string, line: string): HTMLElement {
  const node = el('div', className);
  node.append(el('div', 'soba-Budget-label', label), el('div', 'soba-Budget-line', line));
  return node;
}

/** The nodes for one notebook's state (exported for tests of the rendering rules). */
export function render(state: IBudgetState): HTMLElement[] {
  const nodes = state.snapshot
    ? figures(state.snapshot)
    : [el('div', 'soba-Budget-empty', NO_DATA)];
  if (state.progress) {
    nodes.push(el('div', 'soba-Budget-live', state.progress.line));
  } else if (state.snapshot?.headsUp) {
    // SPEC §14: the line the cell printed as the turn ended, as the kernel words it; a
    // running barrier is the compaction it announced, so it gives way to the live line.
    const headsUp = el('div', 'soba-Budget-headsUp', state.snapshot.headsUp);
    headsUp.dataset.sobaRole = HEADS_UP_ROLE;
    headsUp.setAttribute('role', 'status');
    nodes.push(headsUp);
  }
  if (state.lastResult) {
    const { line, degraded } = state.lastResult;
    // SPEC §9: the result line says "fallback" when the capsule is degraded.
    const shown = degraded && !line.includes('fallback') ? `${line} · fallback` : line;
    const result = outcome('soba-Budget-result', 'last compaction', shown);
    result.dataset.degraded = String(degraded);
    nodes.push(result);
  }
  if (state.lastAttempt) {
    nodes.push(outcome('soba-Budget-attempt', 'last attempt', state.lastAttempt));
  }
  return nodes;
}

function button(label: string, className: string, title: string, onClick: () => void) {
  const node = el('button', `soba-Budget-button ${className} jp-Button`, label);
  node.setAttribute('type', 'button');
  node.title = title;
  node.addEventListener('click', onClick);
  return node as HTMLButtonElement;
}

export class BudgetPanel extends Widget {
  private _notebook: NotebookPanel | null = null;
  private readonly _name = el('div', 'soba-Budget-notebook');
  private readonly _compact: HTMLButtonElement;
  private readonly _auto: HTMLButtonElement;
  private readonly _cancel: HTMLButtonElement;
  private readonly _export: HTMLButtonElement;
  private readonly _answer = el('div', 'soba-Budget-answer');
  private readonly _body = el('div', 'soba-Budget-body');

  private readonly _chatView: ChatView;

  constructor(
    private readonly _store: BudgetStore,
    private readonly _chat: ChatController,
    rendermime: IRenderMimeRegistry | null
  ) {
    super();
    this._chatView = new ChatView(
      {
        submit: text => this._withNotebook(panel => this._chat.submit(panel, text)),
        steer: text => this._withNotebook(panel => this._chat.steer(panel, text)),
        answer: value => this._withNotebook(async panel => this._chat.stateOf(panel).question?.answer(value)),
        editQueued: (id, text) => this._withNotebook(panel => this._chat.editQueued(panel, id, text)),
        removeQueued: id => this._withNotebook(panel => this._chat.removeQueued(panel, id))
      },
      rendermime
    );
    this.id = PANEL_ID;
    this.addClass('soba-Budget');
    this.title.caption = PANEL_CAPTION;
    this._compact = button(
      'Compact now',
      'soba-Budget-compact',
      'Compact the context now (%compact)',
      () => this._ask({ type: 'compact' })
    );
    this._auto = button(
      'Auto-compact',
      'soba-Budget-autoToggle',
      'Turn the soft compaction triggers on or off (%auto_compact)',
      () => this._toggleAuto()
    );
    this._auto.setAttribute('role', 'switch');
    this._cancel = button(
      'Cancel',
      'soba-Budget-cancel',
      'Interrupt the kernel: stops the running %soba or %compact cleanly',
      () => void this._notebook?.sessionContext.session?.kernel?.interrupt()
    );
    this._export = button(
      'Export capsule…',
      'soba-Budget-export',
      'Write the latest capsule to a .capsule.md file',
      () => void this._exportCapsule()
    );
    const controls = el('div', 'soba-Budget-controls');
    controls.append(this._compact, this._auto, this._cancel, this._export);
    const heading = el('h2', 'soba-Budget-title', PANEL_TITLE);
    const budget = el('details', 'soba-Budget-section');
    budget.setAttribute('open', '');
    const summary = el('summary', 'soba-Budget-summary', 'context budget');
    budget.append(summary, controls, this._answer, this._body);
    this.node.append(heading, this._name, budget, this._chatView.node);
    const redraw = (_: unknown, panel: NotebookPanel) => {
      if (panel === this._notebook) {
        this.update();
      }
    };
    _store.changed.connect(redraw);
    _chat.changed.connect(redraw);
  }

  /** Put the cursor in the prompt box (the `soba:ask` command, Ctrl/Cmd+Alt+S). */
  focusPrompt(): void {
    this._chatView.focus();
  }

  private _withNotebook(action: (panel: NotebookPanel) => Promise<void>): void {
    const notebook = this._live();
    if (notebook) {
      void action(notebook);
    }
  }

  /** Show the budget of `notebook` (null: no notebook is current). */
  showNotebook(notebook: NotebookPanel | null): void {
    this._notebook?.title.changed.disconnect(this._onChanged, this);
    this._notebook?.sessionContext.statusChanged.disconnect(this._onChanged, this);
    this._notebook = notebook;
    notebook?.title.changed.connect(this._onChanged, this);
    notebook?.sessionContext.statusChanged.connect(this._onChanged, this);
    this.update();
  }

  private _onChanged(): void {
    this.update();
  }

  private _live(): NotebookPanel | null {
    const notebook = this._notebook;
    return notebook && !notebook.isDisposed ? notebook : null;
  }

  private _ask(request: Parameters<BudgetStore['request']>[1]): void {
    const notebook = this._live();
    if (notebook) {
      void this._store.request(notebook, request);
    }
  }

  private _toggleAuto(): void {
    const notebook = this._live();
    const snapshot = notebook && this._store.stateOf(notebook).snapshot;
    if (snapshot) {
      this._ask({ type: 'auto', on: !snapshot.auto });
    }
  }

  private async _exportCapsule(): Promise<void> {
    const notebook = this._live();
    if (!notebook) {
      return;
    }
    const answer = await InputDialog.getText({
      title: 'Export capsule',
      label: "Write the latest capsule to (relative to the notebook's folder):",
      text: capsuleFileName(notebook.context.path),
      okLabel: 'Export'
    });
    const path = answer.value?.trim();
    if (answer.button.accept && path) {
      this._ask({ type: 'export', path });
    }
  }

  protected onUpdateRequest(): void {
    const notebook = this._live();
    const state = notebook ? this._store.stateOf(notebook) : null;
    this._name.textContent = notebook ? notebook.title.label : '';
    this._updateControls(notebook, state);
    this._chatView.node.hidden = !notebook;
    if (!notebook || !state) {
      this._body.replaceChildren(el('div', 'soba-Budget-empty', NO_NOTEBOOK));
      return;
    }
    this._body.replaceChildren(...render(state));
    this._chatView.update(state, this._chat.stateOf(notebook));
  }

  private _updateControls(notebook: NotebookPanel | null, state: IBudgetState | null): void {
    const pending = state?.control?.pending ?? false;
    const auto = state?.snapshot?.auto;
    this._compact.disabled = !notebook || pending;
    this._export.disabled = !notebook || pending;
    // The state to flip comes from the kernel's snapshot: none yet, nothing to flip.
    this._auto.disabled = !notebook || pending || auto === undefined;
    this._auto.textContent =
      auto === undefined ? 'Auto-compact' : `Auto-compact: ${auto ? 'on' : 'off'}`;
    this._auto.setAttribute('aria-checked', String(auto === true));
    const status = notebook?.sessionContext.kernelDisplayStatus;
    const running = state?.conversation.running ?? null;
    this._cancel.disabled = !notebook || (status !== 'busy' && !state?.progress && running === null);
    const control = state?.control;
    this._answer.textContent = control?.text ?? '';
    this._answer.dataset.ok = String(control?.ok ?? true);
    this._answer.dataset.pending = String(pending);
    this._answer.hidden = !control;
  }

  protected onAfterShow(): void {
    this.update();
  }
}
