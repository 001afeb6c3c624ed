/**
 * Cells the agent proposes (`add_cell`, SPEC §10), inserted below the running cell while the
 * turn runs — in JupyterLab and Notebook 7 alike: the plugin needs only the notebook tracker.
 *
 * The kernel sends each proposal as an `add_cell` message on the `soba_nb.monitor` comms
 * (the budget store opens one on every notebook whose cells use soba, sidebar or not). The
 * inserter reads them from the notebook's iopub, so any open comm will do, and acts only on
 * those whose request came from this page (`parent_header.session`): another browser on the
 * same kernel did not run the cell. A proposal goes below the cell named by `cellId` (else
 * the running one), after the cells of the same run already put there, so the second
 * proposal of a turn lands below the first; a Markdown proposal becomes a Markdown cell;
 * nothing is run. The same message may arrive on several comms: its turn and index say
 * when it is a copy.
 *
 * The duplicate. The kernel also sends the last proposal as IPython's `set_next_input`
 * payload (VS Code and nbclient rely on it), and JupyterLab's cell executor inserts that
 * text as a code cell right below the executed cell when the execute_reply arrives, then
 * emits `NotebookActions.executed` (`handlePayload` in @jupyterlab/notebook's
 * cellexecutor.ts). So on `executed`, the fresh code cell right below the cell whose run
 * put cells there, holding exactly the last proposal's `set_next_input` text, is that copy,
 * and is removed — once per run, never a cell this page inserted itself. When the proposals
 * arrive late (the cell that ran `%load_ext soba_nb` also ran the turn, so the comm opened
 * only afterwards and the kernel sent them then), the copy is already there and the
 * proposals go above it: it is then the fresh cell right below the last one inserted. A
 * late proposal is inserted only below the run this page saw end with its execution count;
 * an older run's never.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import {
  INotebookModel,
  INotebookTracker,
  Notebook,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { KernelMessage } from '@jupyterlab/services';

import { IAddCell, nextInputText, ownCommData, parseAddCell } from './messages';

/** Runs remembered (their inserted cells, the copy removed or not); the oldest go first. */
const MAX_RUNS = 64;

/** What the inserter reads of a cell model (a code cell's run state; others lack it). */
interface ICellState {
  readonly id: string;
  readonly type: string;
  readonly executionCount?: number | null;
  readonly executionState?: string;
  readonly outputs?: { readonly length: number };
}

/** One run of a cell that proposed cells: where they went, in the order they came. */
interface IRun {
  /** The id of the cell that ran (the anchor). */
  anchorId: string;
  /** Ids of the cells inserted below it, in the order the proposals came. */
  placed: string[];
  /** The `set_next_input` text of the last proposal: what the payload's copy holds. */
  nextInput: string;
  /** Whether that copy was found and removed (there is at most one per run). */
  copyRemoved: boolean;
  /** `turn/index` of the proposals inserted: a second copy of a message is dropped. */
  seen: Set<string>;
}

/** Where in the notebook a cell is, and its model. */
interface IFound {
  index: number;
  cell: ICellState;
}

/** Signal arguments of `NotebookActions.executed` (the part used here). */
interface IExecuted {
  notebook: Notebook;
  cell: { model: ICellState };
  success: boolean;
}

const isRunning = (cell: ICellState): boolean => cell.executionState === 'running';

/** A code cell as `set_next_input` leaves it: never run, no outputs. */
const isFresh = (cell: ICellState): boolean =>
  cell.type === 'code' && cell.executionCount == null && (cell.outputs?.length ?? 0) === 0;

export class CellInserter {
  constructor(private readonly _tracker: INotebookTracker) {
    _tracker.forEach(panel => this._follow(panel));
    _tracker.widgetAdded.connect((_, panel) => this._follow(panel), this);
    NotebookActions.executed.connect(this._onExecuted, this);
  }

  /** Session contexts listened to (two views of one notebook share one). */
  private readonly _contexts = new WeakSet<ISessionContext>();
  /** Runs that proposed cells, by `anchorId executionCount`, oldest first. */
  private readonly _runs = new Map<string, IRun>();
  /** The execution count of each cell's last run this page saw end. */
  private readonly _witnessed = new WeakMap<ICellState, number | null>();

  private _follow(panel: NotebookPanel): void {
    const context = panel.sessionContext;
    if (this._contexts.has(context)) {
      return;
    }
    this._contexts.add(context);
    // The context's signals are cleared when it is disposed: nothing to disconnect.
    context.iopubMessage.connect(this._onIOPub, this);
  }

  private _onIOPub(context: ISessionContext, msg: KernelMessage.IMessage): void {
    const proposal = parseAddCell(ownCommData(context, msg));
    if (!proposal) {
      return;
    }
    const panel = this._tracker.find(widget => widget.sessionContext === context);
    if (panel?.content.model) {
      this._insert(panel.content, panel.content.model, proposal);
    }
  }

  private _insert(notebook: Notebook, model: INotebookModel, proposal: IAddCell): void {
    const anchor = this._anchor(notebook, proposal.cellId);
    if (!anchor) {
      return;
    }
    const live = isRunning(anchor.cell);
    if (!live && this._witnessed.get(anchor.cell) !== proposal.executionCount) {
      return; // a late proposal of a run this page did not see end (or a later run since)
    }
    const run = this._run(anchor.cell.id, proposal.executionCount);
    const name = `${proposal.turn}/${proposal.index}`;
    if (run.seen.has(name)) {
      return;
    }
    run.seen.add(name);
    const last = this._lastPlaced(model, run);
    const index = last >= 0 ? last + 1 : anchor.index + 1;
    const inserted = model.sharedModel.insertCell(
      index,
      proposal.kind === 'code'
        ? // Written by the kernel, not the user: untrusted, as JupyterLab does with payloads.
          { cell_type: 'code', source: proposal.source, metadata: { trusted: false } }
        : { cell_type: 'markdown', source: proposal.source }
    );
    run.placed.push(inserted.getId());
    run.nextInput = nextInputText(proposal);
    if (!live) {
      this._removeCopy(model, run, this._lastPlaced(model, run) + 1);
    }
  }

  /** The cell named `cellId`; without an id, the running cell (else the active one). */
  private _anchor(notebook: Notebook, cellId: string | null): IFound | null {
    const cells: ICellState[] = notebook.widgets.map(widget => widget.model);
    let index =
      cellId !== null
        ? cells.findIndex(cell => cell.id === cellId)
        : cells.findIndex(isRunning);
    if (cellId === null && index < 0) {
      index = notebook.activeCellIndex;
    }
    return index >= 0 && index < cells.length ? { index, cell: cells[index] } : null;
  }

  private _run(anchorId: string, executionCount: number | null): IRun {
    const key = `${anchorId} ${executionCount}`;
    let run = this._runs.get(key);
    if (!run) {
      run = { anchorId, placed: [], nextInput: '', copyRemoved: false, seen: new Set() };
      this._runs.set(key, run);
      for (const old of this._runs.keys()) {
        if (this._runs.size <= MAX_RUNS) {
          break;
        }
        this._runs.delete(old);
      }
    }
    return run;
  }

  /** The index of the last cell this run put in the notebook still there, or -1. */
  private _lastPlaced(model: INotebookModel, run: IRun): number {
    const cells = model.sharedModel.cells;
    for (let n = run.placed.length - 1; n >= 0; n--) {
      const index = cells.findIndex(cell => cell.getId() === run.placed[n]);
      if (index >= 0) {
        return index;
      }
    }
    return -1;
  }

  /** The run has ended: the payload's copy of its last proposal sits right below it. */
  private _onExecuted(_: unknown, args: IExecuted): void {
    const anchor = args.cell.model;
    const count = anchor.executionCount ?? null;
    this._witnessed.set(anchor, count);
    const run = this._runs.get(`${anchor.id} ${count}`);
    const model = args.notebook.model;
    if (!run || !model || !args.success) {
      return;
    }
    const index = args.notebook.widgets.findIndex(widget => widget.model.id === anchor.id);
    if (index >= 0) {
      this._removeCopy(model, run, index + 1);
    }
  }

  /** Remove the cell at `index` if it is the payload's copy of `run`'s last proposal. */
  private _removeCopy(model: INotebookModel, run: IRun, index: number): void {
    if (run.copyRemoved || index <= 0 || index >= model.cells.length) {
      return;
    }
    const cell: ICellState = model.cells.get(index);
    const ours = [...this._runs.values()].some(other => other.placed.includes(cell.id));
    if (!ours && isFresh(cell) && model.sharedModel.cells[index].getSource() === run.nextInput) {
      model.sharedModel.deleteCell(index);
      run.copyRemoved = true;
    }
  }
}

export const proposedCells: JupyterFrontEndPlugin<void> = {
  id: 'soba-nb-labextension:add-cell',
  description: 'Cells the soba agent proposes (add_cell), inserted below the running cell.',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker): void => {
    new CellInserter(tracker);
  }
};
