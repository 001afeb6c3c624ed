/**
 * The Fix button (`fix-cell`, SPEC §18) under a failed cell's error output: it runs
 * `%soba /fix --cell N` for that cell through the sidebar's conversation (now, or queued
 * after what runs), where the answer, the receipts and the proposed edit show.
 *
 * A cell gets the button when its outputs hold an error and it has an execution count (the
 * kernel records the cells it runs; it answers in one line when it does not know In [N]);
 * running it again, or clearing its outputs, takes the button away.
 */

import { Cell, CodeCell } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';

const ROLE = 'fix-cell';

function hasError(cell: CodeCell): boolean {
  const outputs = cell.model.outputs;
  for (let i = 0; i < outputs.length; i++) {
    if (outputs.get(i).type === 'error') {
      return true;
    }
  }
  return false;
}

export class FixButtons {
  constructor(private readonly _fix: (panel: NotebookPanel, executionCount: number) => void) {}

  private readonly _followed = new WeakSet<Cell>();

  /** Follow every cell of `panel`, now and as cells are added. */
  follow(panel: NotebookPanel): void {
    const notebook = panel.content;
    const scan = () => notebook.widgets.forEach(cell => this._followCell(panel, cell));
    scan();
    notebook.model?.cells.changed.connect(() => window.setTimeout(scan, 0));
    notebook.modelChanged.connect(() => window.setTimeout(scan, 0));
  }

  private _followCell(panel: NotebookPanel, cell: Cell): void {
    if (!(cell instanceof CodeCell) || this._followed.has(cell)) {
      return;
    }
    this._followed.add(cell);
    const sync = () => this._sync(panel, cell);
    cell.model.outputs.changed.connect(sync);
    cell.model.stateChanged.connect(sync);
    sync();
  }

  private _sync(panel: NotebookPanel, cell: CodeCell): void {
    if (cell.isDisposed) {
      return;
    }
    const count = cell.model.executionCount;
    const existing = cell.node.querySelector(`:scope > [data-soba-role="${ROLE}"]`);
    const wanted = count !== null && hasError(cell);
    if (!wanted) {
      existing?.remove();
      return;
    }
    if (existing && (existing as HTMLElement).dataset.sobaCount === String(count)) {
      return;
    }
    existing?.remove();
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'soba-FixCell jp-Button';
    button.dataset.sobaRole = ROLE;
    button.dataset.sobaCount = String(count);
    button.textContent = `Fix In [${count}] with soba`;
    button.title = `Ask soba to fix this cell (%soba /fix --cell ${count}); you accept or reject its edit`;
    button.setAttribute('aria-label', `Fix cell In [${count}] with soba`);
    button.addEventListener('click', () => this._fix(panel, count as number));
    cell.node.append(button);
  }
}
