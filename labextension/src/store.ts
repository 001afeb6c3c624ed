/**
 * The budget state of each open notebook, fed by its kernel's `soba_nb.monitor` comm.
 *
 * The store only reads what the kernel sends (SPEC: the UI reads the budget, never writes
 * it; the buttons ask the kernel to act, through `controls`, and the figures come back as
 * usual). It follows kernel changes and restarts through the notebook's session context.
 * The store opens the comm (the kernel never does: frontends without the target would log
 * errors), when a cell that uses soba is about to run or has run, or at once when the kernel
 * still holds a comm from before a page reload. It does so in Notebook 7 too, with no panel
 * to show: the comm also carries the cells the agent proposes (`cells.ts` reads them).
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { Notebook, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { ControlRequest, NO_KERNEL, sendControl } from './controls';
import { IConversation, emptyConversation, reduceTurn, withLine } from './conversation';
import {
  COMM_TARGET,
  IProgress,
  IResult,
  ISnapshot,
  MonitorMessage,
  REFRESH_REQUEST,
  parseMessage
} from './messages';

/** A result line and whether its capsule was the fallback. */
export interface IResultLine {
  line: string;
  degraded: boolean;
}

/** The last button's request: waiting for the kernel, or its answer. */
export interface IControlState {
  request: ControlRequest['type'];
  pending: boolean;
  ok: boolean;
  text: string;
}

/** What the panel shows for one notebook. */
export interface IBudgetState {
  /** The latest figures, or null before the kernel sent any. */
  snapshot: ISnapshot | null;
  /** The running barrier, or null when none runs. */
  progress: IProgress | null;
  /** The last compaction's result line (`%budget`'s "Last compaction"). */
  lastResult: IResultLine | null;
  /** The latest operation's line when it did not complete (`%budget`'s "Last attempt"). */
  lastAttempt: string | null;
  /** The last button's request and answer. */
  control: IControlState | null;
  /** The conversation (SPEC §18): every turn, from the prompt box or a cell. */
  conversation: IConversation;
}

const emptyState = (): IBudgetState => ({
  snapshot: null,
  progress: null,
  lastResult: null,
  lastAttempt: null,
  control: null,
  conversation: emptyConversation()
});

/** A finished barrier: a completed one is the last compaction, any other the last attempt. */
function finished(state: IBudgetState, message: IResult): IBudgetState {
  if (message.outcome === 'completed') {
    const lastResult = { line: message.line, degraded: message.degraded };
    return { ...state, progress: null, lastResult, lastAttempt: null };
  }
  return { ...state, progress: null, lastAttempt: message.line };
}

/**
 * Apply one kernel message to a notebook's state. A snapshot is the kernel's whole word
 * on the last compaction and the last attempt (the lines `%budget` shows).
 */
export function reduce(state: IBudgetState, message: MonitorMessage): IBudgetState {
  switch (message.type) {
    case 'snapshot': {
      const lastResult =
        message.lastResult !== null
          ? { line: message.lastResult, degraded: message.degraded }
          : null;
      return { ...state, snapshot: message, lastResult, lastAttempt: message.lastAttempt };
    }
    case 'progress':
      // A barrier is running: the previous attempt's line is not what is happening now.
      return { ...state, progress: message, lastAttempt: null };
    case 'result': {
      // The result line of a compaction this page saw run also goes into the conversation,
      // where it happened (a result replayed when a comm opens is not a new event).
      const conversation = state.progress
        ? withLine(state.conversation, message.line, message.outcome)
        : state.conversation;
      return { ...finished(state, message), conversation };
    }
    case 'turn':
      return { ...state, conversation: reduceTurn(state.conversation, message) };
  }
}

/** What NotebookActions says about a cell it schedules or has run (the part used here). */
interface ICellRun {
  notebook: Notebook;
  cell: { model: { sharedModel: { getSource(): string } } };
}

/** A cell that mentions soba (a magic, an import, `%load_ext`): it may use the target. */
const USES_SOBA = /soba/;

/** A cell that loads the extension, and with it the target. */
const LOADS_SOBA = /%(re)?load_ext\s+soba_nb\b|load_extension\(\s*['"]soba_nb['"]/;

export class BudgetStore {
  constructor() {
    NotebookActions.executionScheduled.connect(this._onScheduled, this);
    NotebookActions.executed.connect(this._onExecuted, this);
  }

  private readonly _states = new Map<NotebookPanel, IBudgetState>();
  /** The comm to each notebook's kernel, from when it is opened until the kernel closes it. */
  private readonly _comms = new Map<NotebookPanel, Kernel.IComm>();
  private readonly _changed = new Signal<this, NotebookPanel>(this);
  /** The id of the request whose barrier is running, per notebook. */
  private readonly _barrierRequests = new Map<NotebookPanel, string>();
  /** The button request whose answer is awaited, per notebook (dropped on a restart). */
  private readonly _pendingControls = new Map<NotebookPanel, object>();

  /** Emits the notebook whose state changed. */
  get changed(): ISignal<this, NotebookPanel> {
    return this._changed;
  }

  /** The state of `panel` (empty when its kernel has sent nothing yet). */
  stateOf(panel: NotebookPanel): IBudgetState {
    return this._states.get(panel) ?? emptyState();
  }

  /**
   * The conversation as the transcript holds it, when nothing was shown yet (a page reload, a
   * notebook opened again): the kernel's `turn` messages only cover turns that run from now.
   */
  setHistory(panel: NotebookPanel, conversation: IConversation): void {
    const state = this._states.get(panel);
    if (state && state.conversation.items.length === 0 && !state.conversation.running) {
      this._set(panel, { ...state, conversation });
    }
  }

  /** Start listening to `panel`'s kernel, now and after every kernel change. */
  track(panel: NotebookPanel): void {
    if (this._states.has(panel)) {
      return;
    }
    this._states.set(panel, emptyState());
    const context = panel.sessionContext;
    context.kernelChanged.connect(this._onKernelChanged, this);
    context.statusChanged.connect(this._onStatusChanged, this);
    context.iopubMessage.connect(this._onIOPubMessage, this);
    panel.disposed.connect(() => {
      context.kernelChanged.disconnect(this._onKernelChanged, this);
      context.statusChanged.disconnect(this._onStatusChanged, this);
      context.iopubMessage.disconnect(this._onIOPubMessage, this);
      const comm = this._comms.get(panel);
      if (comm && !comm.isDisposed) {
        comm.close();
      }
      this._comms.delete(panel);
      this._states.delete(panel);
      this._barrierRequests.delete(panel);
      this._pendingControls.delete(panel);
    });
    const kernel = context.session?.kernel;
    if (kernel) {
      void this._attach(panel, kernel);
    }
  }

  /**
   * Ask `panel`'s kernel to act (a sidebar button); the state shows the request pending,
   * then the kernel's answer. A kernel restart in between drops the answer.
   */
  async request(panel: NotebookPanel, request: ControlRequest): Promise<void> {
    if (!this._states.has(panel)) {
      return;
    }
    const control = (pending: boolean, ok: boolean, text: string): IControlState => ({
      request: request.type,
      pending,
      ok,
      text
    });
    let kernel = panel.sessionContext.session?.kernel;
    if (!kernel && !panel.sessionContext.isReady && !panel.sessionContext.isDisposed) {
      // The notebook was just opened and its kernel is still starting: a click then is
      // meant for that kernel, not answered with "no kernel".
      this._set(panel, {
        ...this.stateOf(panel),
        control: control(true, true, 'waiting for the kernel…')
      });
      await panel.sessionContext.ready;
      if (!this._states.has(panel)) {
        return;
      }
      kernel = panel.sessionContext.session?.kernel;
    }
    if (!kernel) {
      this._set(panel, { ...this.stateOf(panel), control: control(false, false, NO_KERNEL) });
      return;
    }
    const token = {};
    this._pendingControls.set(panel, token);
    this._set(panel, {
      ...this.stateOf(panel),
      control: control(true, true, 'waiting for the kernel…')
    });
    const answer = await sendControl(kernel, request);
    if (this._pendingControls.get(panel) !== token || !this._states.has(panel)) {
      return;
    }
    this._pendingControls.delete(panel);
    this._set(panel, {
      ...this.stateOf(panel),
      control: control(false, answer.ok, answer.text)
    });
  }

  private _panelOf(context: ISessionContext): NotebookPanel | undefined {
    for (const panel of this._states.keys()) {
      if (panel.sessionContext === context) {
        return panel;
      }
    }
    return undefined;
  }

  private _onKernelChanged(
    context: ISessionContext,
    change: {
      oldValue: Kernel.IKernelConnection | null;
      newValue: Kernel.IKernelConnection | null;
    }
  ): void {
    const panel = this._panelOf(context);
    if (!panel) {
      return;
    }
    // A new connection to the same kernel (a reconnect) keeps the kernel's session.
    if (change.oldValue?.id !== change.newValue?.id) {
      this._set(panel, this._restarted(panel));
    }
    if (change.newValue) {
      void this._attach(panel, change.newValue);
    }
  }

  private _onStatusChanged(context: ISessionContext, status: Kernel.Status): void {
    const panel = this._panelOf(context);
    if (panel && (status === 'restarting' || status === 'autorestarting')) {
      // A new kernel process: its session starts over, and so does what we show; its comms
      // went with the old process.
      this._comms.delete(panel);
      this._set(panel, this._restarted(panel));
    }
  }

  /** A new kernel: its figures start over; the conversation stays (the transcript keeps it). */
  private _restarted(panel: NotebookPanel): IBudgetState {
    const { items } = this.stateOf(panel).conversation;
    return { ...emptyState(), conversation: { items, running: null, waiting: null } };
  }

  /**
   * The barrier runs inside the request (a cell) that sent its progress: when that request
   * is over, so is the barrier, even if the result never came (an interrupt, an error).
   */
  private _onIOPubMessage(context: ISessionContext, msg: KernelMessage.IMessage): void {
    if (!KernelMessage.isStatusMsg(msg) || msg.content.execution_state !== 'idle') {
      return;
    }
    const panel = this._panelOf(context);
    const barrierRequest = panel && this._barrierRequests.get(panel);
    if (panel && barrierRequest && msg.parent_header.msg_id === barrierRequest) {
      this._barrierRequests.delete(panel);
      this._set(panel, { ...this.stateOf(panel), progress: null });
    }
  }

  /**
   * A kernel to follow: if it still holds a comm from an earlier page (a reload), soba is
   * loaded there and a comm can be opened now; otherwise the first cell that uses soba
   * opens one (`_onScheduled`, `_onExecuted`).
   */
  private async _attach(panel: NotebookPanel, kernel: Kernel.IKernelConnection): Promise<void> {
    try {
      const reply = await kernel.requestCommInfo({ target_name: COMM_TARGET });
      if (reply.content.status === 'ok' && Object.keys(reply.content.comms).length > 0) {
        this._connect(panel);
      }
    } catch (reason) {
      console.debug('soba budget: could not list open comms', reason);
    }
  }

  /** A cell about to run that uses soba: open the comm first, so it sees this cell's barrier. */
  private _onScheduled(_: unknown, args: ICellRun): void {
    const panel = this._panelOfNotebook(args.notebook);
    const source = args.cell.model.sharedModel.getSource();
    // A cell that loads soba registers the target itself: the kernel would refuse a comm
    // opened before it runs (and log an error), so it waits for `_onExecuted`.
    if (panel && USES_SOBA.test(source) && !LOADS_SOBA.test(source)) {
      this._connect(panel);
    }
  }

  /** A cell that used or loaded soba has run: the target is there if it ever will be. */
  private _onExecuted(_: unknown, args: ICellRun): void {
    const panel = this._panelOfNotebook(args.notebook);
    if (panel && USES_SOBA.test(args.cell.model.sharedModel.getSource())) {
      this._connect(panel);
    }
  }

  /**
   * Open a comm to the kernel's `soba_nb.monitor` target unless one is open. The kernel
   * answers with its last snapshot; a kernel without the target closes the comm at once.
   */
  connect(panel: NotebookPanel): void {
    this._connect(panel);
  }

  private _connect(panel: NotebookPanel): void {
    const kernel = panel.sessionContext.session?.kernel;
    if (!kernel || !this._states.has(panel)) {
      return;
    }
    const open = this._comms.get(panel);
    if (open && !open.isDisposed && kernel.hasComm(open.commId)) {
      return;
    }
    const comm = kernel.createComm(COMM_TARGET);
    comm.onMsg = msg => this._receive(panel, msg);
    comm.onClose = () => {
      if (this._comms.get(panel) === comm) {
        this._comms.delete(panel);
      }
    };
    this._comms.set(panel, comm);
    comm.open(REFRESH_REQUEST);
  }

  private _receive(panel: NotebookPanel, msg: KernelMessage.ICommMsgMsg): void {
    const message = parseMessage(msg.content.data);
    if (!message || !this._states.has(panel)) {
      return;
    }
    if (message.type === 'turn' && message.images) {
      // The kernel names images relative to the notebook's folder; the panel shows them
      // from the server's root.
      const folder = PathExt.dirname(panel.context.path);
      message.images = message.images.map(image => PathExt.join(folder, image));
    }
    if (message.type === 'progress' && msg.parent_header.msg_id) {
      this._barrierRequests.set(panel, msg.parent_header.msg_id);
    }
    this._set(panel, reduce(this.stateOf(panel), message));
  }

  private _panelOfNotebook(notebook: Notebook): NotebookPanel | undefined {
    for (const panel of this._states.keys()) {
      if (panel.content === notebook) {
        return panel;
      }
    }
    return undefined;
  }

  private _set(panel: NotebookPanel, state: IBudgetState): void {
    if (!state.progress) {
      this._barrierRequests.delete(panel);
    }
    if (!state.control) {
      this._pendingControls.delete(panel);
    }
    this._states.set(panel, state);
    this._changed.emit(panel);
  }
}
