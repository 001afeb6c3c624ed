/**
 * What the user does in the sidebar's conversation (SPEC §18), per notebook: send a request,
 * queue one while a turn or a compaction runs, steer the running turn, answer an approval
 * question, and the Fix button's `/fix --cell N`.
 *
 * - Send (Enter) when nothing runs: the request runs as a turn in the notebook's kernel
 *   (`turns.runRequest`). While the kernel is busy (a turn, a compaction, the user's own
 *   cell), Enter queues it instead.
 * - The queue lives in the Jupyter server (`serverapi`, `<stem>.soba/queue.json`): it survives
 *   a page reload and is shared by every page on the notebook; items are edited and removed
 *   there. When the kernel is idle again, the next item is taken off the queue (atomically,
 *   so two pages never run one item twice) and run.
 * - Steer while a turn runs: the message goes to the kernel's inbox through the server (the
 *   busy kernel does not read its shell channel), and the turn takes it at its next tool
 *   boundary as a user message; until then the panel shows it as waiting.
 */

import { NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';

import { fromTranscript } from './conversation';
import {
  IQueueItem,
  addToQueue,
  conversationOf,
  editQueued,
  listQueue,
  removeQueued,
  sendToInbox,
  takeNext
} from './serverapi';
import { BudgetStore } from './store';
import { IQuestion, LOAD_SOBA, fixCode, runRequest, turnCode } from './turns';

/** The conversation's controls' state for one notebook. */
export interface IChatState {
  /** The queued requests, in the order they will run. */
  queue: IQueueItem[];
  /** Steer messages sent and not yet taken by the running turn. */
  steers: string[];
  /** An approval question of a request sent from here, waiting for the user. */
  question: IQuestion | null;
  /** A request sent from here is running. */
  sending: boolean;
  /** The last thing that went wrong (one line), or null. */
  error: string | null;
  /** What the last request printed without a turn (a slash command's lines). */
  output: string | null;
}

const emptyChat = (): IChatState => ({
  queue: [],
  steers: [],
  question: null,
  sending: false,
  error: null,
  output: null
});

export class ChatController {
  constructor(private readonly _store: BudgetStore) {
    _store.changed.connect((_, panel) => this._onBudget(panel), this);
  }

  private readonly _states = new Map<NotebookPanel, IChatState>();
  private readonly _changed = new Signal<this, NotebookPanel>(this);
  private readonly _followed = new WeakSet<NotebookPanel>();

  get changed(): ISignal<this, NotebookPanel> {
    return this._changed;
  }

  stateOf(panel: NotebookPanel): IChatState {
    return this._states.get(panel) ?? emptyChat();
  }

  /** Follow `panel`: its queue and its conversation as the transcript holds it. */
  follow(panel: NotebookPanel): void {
    if (this._followed.has(panel)) {
      return;
    }
    this._followed.add(panel);
    this._states.set(panel, emptyChat());
    panel.sessionContext.statusChanged.connect(this._onStatus, this);
    panel.disposed.connect(() => this._states.delete(panel));
    void panel.context.ready.then(async () => {
      await this._loadHistory(panel);
      await this._guarded(panel, () => this._refreshQueue(panel));
    });
  }

  /** A busy kernel (a turn, a compaction, a user cell) or a request of ours running. */
  busy(panel: NotebookPanel): boolean {
    const status = panel.sessionContext.session?.kernel?.status;
    const conversation = this._store.stateOf(panel).conversation;
    return this.stateOf(panel).sending || conversation.running !== null || status === 'busy';
  }

  /** Enter in the prompt box: run now, or queue when something runs. */
  async submit(panel: NotebookPanel, text: string): Promise<void> {
    if (!text.trim()) {
      return;
    }
    if (this.busy(panel)) {
      await this._guarded(panel, async () => {
        await addToQueue(panel.context.path, text);
        await this._refreshQueue(panel);
      });
      return;
    }
    await this._run(panel, turnCode(text));
  }

  /** Steer: into the running turn at its next tool boundary; with nothing running, send. */
  async steer(panel: NotebookPanel, text: string): Promise<void> {
    if (!text.trim()) {
      return;
    }
    if (this._store.stateOf(panel).conversation.running === null) {
      await this.submit(panel, text);
      return;
    }
    await this._guarded(panel, async () => {
      await sendToInbox(panel.context.path, { kind: 'steer', text });
      this._update(panel, { steers: [...this.stateOf(panel).steers, text] });
    });
  }

  /** The Fix button: `/fix` for the failed cell In [n], now or after what runs. */
  async fix(panel: NotebookPanel, executionCount: number): Promise<void> {
    const request = `/fix --cell ${executionCount}`;
    if (this.busy(panel)) {
      await this.submit(panel, request);
      return;
    }
    await this._run(panel, fixCode(executionCount));
  }

  async editQueued(panel: NotebookPanel, id: string, text: string): Promise<void> {
    await this._guarded(panel, async () => {
      await (text.trim()
        ? editQueued(panel.context.path, id, text)
        : removeQueued(panel.context.path, id));
      await this._refreshQueue(panel);
    });
  }

  async removeQueued(panel: NotebookPanel, id: string): Promise<void> {
    await this._guarded(panel, async () => {
      await removeQueued(panel.context.path, id);
      await this._refreshQueue(panel);
    });
  }

  private async _run(panel: NotebookPanel, code: string): Promise<void> {
    const context = panel.sessionContext;
    if (!context.session?.kernel && !context.isReady && !context.isDisposed) {
      // The notebook was just opened and its kernel is still starting: the request is meant
      // for that kernel, not answered with "no kernel".
      this._update(panel, { sending: true, error: null });
      await context.ready;
    }
    const kernel = context.session?.kernel;
    if (!kernel) {
      this._update(panel, { sending: false });
      this._update(panel, { error: 'this notebook has no running kernel' });
      return;
    }
    const turnsBefore = this._turnCount(panel);
    this._update(panel, { sending: true, error: null, output: null });
    // soba may not be loaded in this kernel yet: load it (quietly; a no-op when it is), then
    // open the comm its turn messages come on, before the turn starts.
    await runRequest(kernel, LOAD_SOBA, () => undefined, true);
    this._store.connect(panel);
    const end = await runRequest(kernel, code, question => this._update(panel, { question }));
    // A request that ran no turn (a slash command, a refusal) shows what it printed.
    const ranTurn = this._turnCount(panel) > turnsBefore;
    const output = !ranTurn && end.output.trim() ? end.output.trim() : null;
    this._update(panel, { sending: false, question: null, output });
    await this._next(panel);
  }

  private _turnCount(panel: NotebookPanel): number {
    return this._store.stateOf(panel).conversation.items.filter(item => item.kind === 'user' && !item.steer)
      .length;
  }

  /** When nothing runs: the next queued request, taken off the queue, runs. */
  private async _next(panel: NotebookPanel): Promise<void> {
    if (this.busy(panel) || !this._states.has(panel)) {
      return;
    }
    let item: IQueueItem | null = null;
    await this._guarded(panel, async () => {
      item = await takeNext(panel.context.path);
      await this._refreshQueue(panel);
    });
    if (item !== null && !this.busy(panel)) {
      await this._run(panel, turnCode((item as IQueueItem).text));
    }
  }

  private _onStatus(context: NotebookPanel['sessionContext'], status: string): void {
    if (status !== 'idle') {
      return;
    }
    for (const [panel, state] of this._states) {
      if (panel.sessionContext === context && state.queue.length > 0) {
        // The kernel answered something else (a user cell): queued requests run now.
        window.setTimeout(() => void this._next(panel), 0);
      }
    }
  }

  /** A turn ended or took a steer: the waiting steers it took are no longer waiting. */
  private _onBudget(panel: NotebookPanel): void {
    const state = this._states.get(panel);
    if (!state || state.steers.length === 0) {
      return;
    }
    const { items, running } = this._store.stateOf(panel).conversation;
    const taken = new Set(items.filter(item => item.steer).map(item => item.text));
    const steers = running === null ? [] : state.steers.filter(text => !taken.has(text));
    if (steers.length !== state.steers.length) {
      this._update(panel, { steers });
    }
  }

  private async _loadHistory(panel: NotebookPanel): Promise<void> {
    try {
      const conversation = fromTranscript(await conversationOf(panel.context.path));
      if (conversation) {
        this._store.setHistory(panel, conversation);
      }
    } catch (reason) {
      console.debug('soba: no conversation to read back', reason);
    }
  }

  private async _refreshQueue(panel: NotebookPanel): Promise<void> {
    const queue = await listQueue(panel.context.path);
    this._update(panel, { queue });
  }

  /** Run a server call; a failure becomes the panel's one-line error. */
  private async _guarded(panel: NotebookPanel, action: () => Promise<void>): Promise<void> {
    try {
      await action();
    } catch (reason) {
      this._update(panel, { error: reason instanceof Error ? reason.message : String(reason) });
    }
  }

  private _update(panel: NotebookPanel, change: Partial<IChatState>): void {
    if (!this._states.has(panel)) {
      return;
    }
    this._states.set(panel, { ...this.stateOf(panel), ...change });
    this._changed.emit(panel);
  }
}
