/**
 * The status-bar item: `soba 31.2k / 48.8k` (effective / hardLimit of the current
 * notebook, then ` · $0.0123` when the session is priced) coloured by level (ok / soft /
 * hard), or `soba compacting 42%` while a barrier runs. Shown only once the current notebook's kernel has sent its figures; a click opens
 * the sidebar panel.
 */

import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { level } from './panel';
import { BudgetStore, IBudgetState } from './store';

export const STATUS_ITEM_ID = 'soba-nb-labextension:budget-status';
const THOUSAND = 1000;

/** `31.2k`: thousands with one decimal. */
export const thousands = (count: number): string => `${(count / THOUSAND).toFixed(1)}k`;

/** The session's cost from the kernel's cost line (`Cost: $0.0123 this session …`), or ''. */
const COST_AMOUNT = /^Cost: (\$\d+\.\d+) this session/;

/** The item's text for a notebook's state, or null when there is nothing to show. */
export function statusText(state: IBudgetState): string | null {
  if (state.progress) {
    return `soba compacting ${state.progress.percent}%`;
  }
  const snapshot = state.snapshot;
  if (!snapshot) {
    return null;
  }
  const cost = COST_AMOUNT.exec(snapshot.cost ?? '');
  const spent = cost ? ` · ${cost[1]}` : '';
  return `soba ${thousands(snapshot.effective)} / ${thousands(snapshot.hardLimit)}${spent}`;
}

export class BudgetStatus extends Widget {
  private _notebook: NotebookPanel | null = null;
  private _shown = false;
  private readonly _activeChanged = new Signal<this, void>(this);

  constructor(
    private readonly _store: BudgetStore,
    tracker: INotebookTracker,
    onClick: () => void
  ) {
    super();
    this.addClass('soba-StatusItem');
    this.node.title = 'soba: context budget of this notebook (effective / hard limit)';
    this.node.addEventListener('click', onClick);
    this._notebook = tracker.currentWidget;
    tracker.currentChanged.connect((_, notebook) => {
      this._notebook = notebook;
      this._refresh();
    });
    _store.changed.connect((_, panel) => {
      if (panel === this._notebook) {
        this._refresh();
      }
    });
    this._refresh();
  }

  /** Emits when the item starts or stops having something to show. */
  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  /** Whether the status bar should show the item. */
  get shown(): boolean {
    return this._shown;
  }

  private _refresh(): void {
    const notebook = this._notebook;
    const state = notebook && !notebook.isDisposed ? this._store.stateOf(notebook) : null;
    const text = state ? statusText(state) : null;
    this.node.textContent = text ?? '';
    this.node.dataset.level = state?.snapshot ? level(state.snapshot) : 'ok';
    this.node.dataset.compacting = String(Boolean(state?.progress));
    if (this._shown !== (text !== null)) {
      this._shown = text !== null;
      this._activeChanged.emit();
    }
  }
}
