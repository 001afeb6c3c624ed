/**
 * The "soba budget" sidebar panel: plain DOM in a Lumino widget, redrawn from the store.
 *
 * Shows, for the current notebook, effective tokens against hardLimit as a bar with the soft
 * threshold marked, the measurement source, auto on/off, the last compaction's result line,
 * and during a barrier the live line `Compacting context before response · NN%`.
 */

import { NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { ISnapshot } from './messages';
import { BudgetStore, IBudgetState } from './store';

export const PANEL_ID = 'soba-budget-panel';
export const PANEL_TITLE = 'soba budget';
export const NO_NOTEBOOK = 'Open a notebook to see its context budget.';
export const NO_DATA = 'Run %budget or %soba in this notebook';
export const LIVE_LINE = (percent: number): string =>
  `Compacting context before response · ${percent}%`;

const PERCENT = 100;
const SOURCE_LABELS: Record<string, string> = {
  provider_usage: 'provider usage',
  estimated: 'estimated'
};

/** Thousands separators as Python's `f"{n:,}"` writes them, whatever the browser locale. */
export const tokens = (count: number): string => count.toLocaleString('en-US');

/** `ok` below the soft threshold, `soft` from it, `hard` over the hard limit (SPEC §6:
 * the `hard_limit` trigger fires when effective > hardLimit), as the inline monitor does. */
export function level(snapshot: ISnapshot): 'ok' | 'soft' | 'hard' {
  if (snapshot.effective > snapshot.hardLimit) {
    return 'hard';
  }
  return snapshot.effective >= snapshot.softLimit ? 'soft' : 'ok';
}

const share = (part: number, whole: number): number =>
  whole > 0 ? Math.min(PERCENT, Math.max(0, (PERCENT * part) / whole)) : 0;

function el(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

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
    ...(snapshot.session ? [row('session', snapshot.session)] : [])
  ];
}

/** The nodes for one notebook's state (exported for tests of the rendering rules). */
export function render(state: IBudgetState): HTMLElement[] {
  const nodes = state.snapshot
    ? figures(state.snapshot)
    : [el('div', 'soba-Budget-empty', NO_DATA)];
  if (state.progress) {
    nodes.push(el('div', 'soba-Budget-live', LIVE_LINE(state.progress.percent)));
  }
  if (state.lastResult) {
    const { line, degraded } = state.lastResult;
    // SPEC §9: the result line says "fallback" when the capsule is degraded.
    const shown = degraded && !line.includes('fallback') ? `${line} · fallback` : line;
    const result = el('div', 'soba-Budget-result');
    result.dataset.degraded = String(degraded);
    result.append(el('div', 'soba-Budget-label', 'last compaction'), el('div', '', shown));
    nodes.push(result);
  }
  return nodes;
}

export class BudgetPanel extends Widget {
  private _notebook: NotebookPanel | null = null;

  constructor(private readonly _store: BudgetStore) {
    super();
    this.id = PANEL_ID;
    this.addClass('soba-Budget');
    this.title.caption = PANEL_TITLE;
    _store.changed.connect((_, panel) => {
      if (panel === this._notebook) {
        this.update();
      }
    });
  }

  /** Show the budget of `notebook` (null: no notebook is current). */
  showNotebook(notebook: NotebookPanel | null): void {
    this._notebook?.title.changed.disconnect(this._onTitleChanged, this);
    this._notebook = notebook;
    notebook?.title.changed.connect(this._onTitleChanged, this);
    this.update();
  }

  private _onTitleChanged(): void {
    this.update();
  }

  protected onUpdateRequest(): void {
    const heading = el('h2', 'soba-Budget-title', PANEL_TITLE);
    const notebook = this._notebook;
    if (!notebook || notebook.isDisposed) {
      this.node.replaceChildren(heading, el('div', 'soba-Budget-empty', NO_NOTEBOOK));
      return;
    }
    this.node.replaceChildren(
      heading,
      el('div', 'soba-Budget-notebook', notebook.title.label),
      ...render(this._store.stateOf(notebook))
    );
  }

  protected onAfterShow(): void {
    this.update();
  }
}
