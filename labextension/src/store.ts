/**
 * The budget state of each open notebook, fed by its kernel's `soba_nb.monitor` comm.
 *
 * The store only reads what the kernel sends (SPEC: the UI reads the budget, never writes
 * it). It follows kernel changes and restarts through the notebook's session context, so
 * the comm target is registered on whichever kernel the notebook is talking to.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import {
  COMM_TARGET,
  IProgress,
  IResult,
  ISnapshot,
  MonitorMessage,
  REFRESH_REQUEST,
  parseMessage
} from './messages';

/** What the panel shows for one notebook. */
export interface IBudgetState {
  /** The latest figures, or null before the kernel sent any. */
  snapshot: ISnapshot | null;
  /** The running barrier, or null when none runs. */
  progress: IProgress | null;
  /** The last compaction's result line. */
  lastResult: Omit<IResult, 'type'> | null;
}

const emptyState = (): IBudgetState => ({ snapshot: null, progress: null, lastResult: null });

/** Apply one kernel message to a notebook's state. */
export function reduce(state: IBudgetState, message: MonitorMessage): IBudgetState {
  switch (message.type) {
    case 'snapshot': {
      const lastResult =
        message.lastResult !== null
          ? { line: message.lastResult, degraded: message.degraded }
          : state.lastResult;
      return { ...state, snapshot: message, lastResult };
    }
    case 'progress':
      return { ...state, progress: message };
    case 'result':
      return {
        ...state,
        progress: null,
        lastResult: { line: message.line, degraded: message.degraded }
      };
  }
}

export class BudgetStore {
  private readonly _states = new Map<NotebookPanel, IBudgetState>();
  private readonly _changed = new Signal<this, NotebookPanel>(this);
  /** The id of the request whose barrier is running, per notebook. */
  private readonly _barrierRequests = new Map<NotebookPanel, string>();

  /** Emits the notebook whose state changed. */
  get changed(): ISignal<this, NotebookPanel> {
    return this._changed;
  }

  /** The state of `panel` (empty when its kernel has sent nothing yet). */
  stateOf(panel: NotebookPanel): IBudgetState {
    return this._states.get(panel) ?? emptyState();
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
      this._states.delete(panel);
      this._barrierRequests.delete(panel);
    });
    const kernel = context.session?.kernel;
    if (kernel) {
      void this._attach(panel, kernel);
    }
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
      this._set(panel, emptyState());
    }
    if (change.newValue) {
      void this._attach(panel, change.newValue);
    }
  }

  private _onStatusChanged(context: ISessionContext, status: Kernel.Status): void {
    const panel = this._panelOf(context);
    if (panel && (status === 'restarting' || status === 'autorestarting')) {
      // A new kernel process: its session starts over, and so does what we show.
      this._set(panel, emptyState());
    }
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

  private async _attach(panel: NotebookPanel, kernel: Kernel.IKernelConnection): Promise<void> {
    const receive = (msg: KernelMessage.ICommOpenMsg | KernelMessage.ICommMsgMsg): void => {
      const message = parseMessage(msg.content.data);
      if (!message || !this._states.has(panel)) {
        return;
      }
      if (message.type === 'progress' && msg.parent_header.msg_id) {
        this._barrierRequests.set(panel, msg.parent_header.msg_id);
      }
      this._set(panel, reduce(this.stateOf(panel), message));
    };
    const listen = (comm: Kernel.IComm): void => {
      comm.onMsg = receive;
    };
    // Registering again on the same kernel replaces the previous callback.
    kernel.registerCommTarget(COMM_TARGET, (comm, open) => {
      listen(comm);
      receive(open);
    });
    await this._adoptOpenComms(kernel, listen);
  }

  /**
   * After a page reload the kernel keeps sending on the comm it opened for the previous
   * page: adopt it by id and ask for the last snapshot again.
   */
  private async _adoptOpenComms(
    kernel: Kernel.IKernelConnection,
    listen: (comm: Kernel.IComm) => void
  ): Promise<void> {
    try {
      const reply = await kernel.requestCommInfo({ target_name: COMM_TARGET });
      if (reply.content.status !== 'ok') {
        return;
      }
      for (const commId of Object.keys(reply.content.comms)) {
        if (kernel.hasComm(commId)) {
          continue;
        }
        const comm = kernel.createComm(COMM_TARGET, commId);
        listen(comm);
        comm.send(REFRESH_REQUEST);
      }
    } catch (reason) {
      console.debug('soba budget: could not list open comms', reason);
    }
  }

  private _set(panel: NotebookPanel, state: IBudgetState): void {
    if (!state.progress) {
      this._barrierRequests.delete(panel);
    }
    this._states.set(panel, state);
    this._changed.emit(panel);
  }
}
