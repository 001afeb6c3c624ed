/**
 * The messages the kernel sends over the `soba_nb.monitor` comm
 * (their Python side is `soba_nb/notebook/comm.py`, which documents the same shapes):
 * the budget sidebar's (`MonitorMessage`) and the cells the agent proposes (`IAddCell`).
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { KernelMessage } from '@jupyterlab/services';

import { ITurnMessage, parseTurn } from './conversation';

/** The comm target registered on every notebook's kernel. */
export const COMM_TARGET = 'soba_nb.monitor';

/** The one request the panel sends: answer with the last snapshot (after a page reload). */
export const REFRESH_REQUEST = { type: 'refresh' };

/** How the effective token count was measured: `provider_usage` or `estimated`. */
export type MeasurementSource = string;

/** The session's budget figures, as `%budget` shows them. */
export interface ISnapshot {
  type: 'snapshot';
  effective: number;
  hardLimit: number;
  softLimit: number;
  source: MeasurementSource;
  auto: boolean;
  /** The last compaction's result line (`%budget`'s "Last compaction"). */
  lastResult: string | null;
  /** The latest operation's result line when it did not complete (`%budget`'s "Last attempt"). */
  lastAttempt: string | null;
  degraded: boolean;
  provider: string;
  session: string;
  /**
   * The session's cost line as the kernel words it (SPEC §11: `Cost: $0.0123 this session
   * (inference $0.0100 · compaction $0.0023) · prices: <source>` or `Cost: not priced`);
   * empty from a kernel that sends none.
   */
  cost: string;
  /**
   * A compaction is near (SPEC §14): the line a turn ending now prints in the cell, as the
   * kernel words it (`soba: context at 36,200 / 39,046 tokens (93% of the auto-compact
   * threshold): the next request may compact first — …`), or null when none is due (auto
   * off, below 85 % of the soft limit, or a turn is running).
   */
  headsUp: string | null;
}

/**
 * A compaction barrier is running. `line` is the live line exactly as the cell shows it
 * (`Compacting context before response · NN%`, or `Compacting context · NN%` for
 * `%compact`): the kernel words it, the panel shows it as is.
 */
export interface IProgress {
  type: 'progress';
  percent: number;
  trigger: string;
  line: string;
}

/** How an operation ended. */
export type Outcome = 'completed' | 'skipped' | 'cancelled' | 'stale' | 'failed';

/** A barrier finished: the live line collapses to this result line (the cell's). */
export interface IResult {
  type: 'result';
  line: string;
  outcome: Outcome;
  degraded: boolean;
}

export type MonitorMessage = ISnapshot | IProgress | IResult | ITurnMessage;

type Fields = Record<string, unknown>;

const isInt = (value: unknown): value is number => Number.isInteger(value);
const isString = (value: unknown): value is string => typeof value === 'string';
const isBool = (value: unknown): value is boolean => typeof value === 'boolean';
const isLine = (value: unknown): boolean =>
  value === null || value === undefined || isString(value);
const OUTCOMES: readonly Outcome[] = ['completed', 'skipped', 'cancelled', 'stale', 'failed'];

function parseSnapshot(data: Fields): ISnapshot | null {
  const ok =
    isInt(data.effective) &&
    isInt(data.hardLimit) &&
    isInt(data.softLimit) &&
    isString(data.source) &&
    isBool(data.auto) &&
    isLine(data.lastResult) &&
    isLine(data.lastAttempt) &&
    isLine(data.headsUp);
  if (!ok) {
    return null;
  }
  return {
    type: 'snapshot',
    effective: data.effective as number,
    hardLimit: data.hardLimit as number,
    softLimit: data.softLimit as number,
    source: data.source as MeasurementSource,
    auto: data.auto as boolean,
    lastResult: (data.lastResult as string | undefined) ?? null,
    lastAttempt: (data.lastAttempt as string | undefined) ?? null,
    degraded: data.degraded === true,
    provider: isString(data.provider) ? data.provider : '',
    session: isString(data.session) ? data.session : '',
    cost: isString(data.cost) ? data.cost : '',
    headsUp: (data.headsUp as string | undefined) ?? null
  };
}

/**
 * The message in a comm payload, or null when it is not one we know (a newer kernel side
 * may send more; the panel ignores what it cannot show rather than showing it wrong).
 */
export function parseMessage(data: unknown): MonitorMessage | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const fields = data as Fields;
  switch (fields.type) {
    case 'snapshot':
      return parseSnapshot(fields);
    case 'progress':
      return isInt(fields.percent) && isString(fields.line)
        ? {
            type: 'progress',
            percent: fields.percent,
            trigger: isString(fields.trigger) ? fields.trigger : '',
            line: fields.line
          }
        : null;
    case 'result':
      return isString(fields.line)
        ? {
            type: 'result',
            line: fields.line,
            outcome: OUTCOMES.find(outcome => outcome === fields.outcome) ?? 'completed',
            degraded: fields.degraded === true
          }
        : null;
    case 'turn':
      return parseTurn(fields);
    default:
      return null;
  }
}

/** What a proposed cell becomes: a code cell or a Markdown cell. */
export type CellKind = 'code' | 'markdown';

/**
 * The agent proposed a cell (`add_cell`, SPEC §10), sent while its turn runs
 * (`soba_nb/notebook/cell_insert.py`). It goes below the cell being run, after the cells
 * of the same run already put there, and is not run.
 */
export interface IAddCell {
  type: 'add_cell';
  /** The cell's whole source. */
  source: string;
  kind: CellKind;
  /** The running cell's id (from the execute_request's metadata), or null if unknown. */
  cellId: string | null;
  /** The running cell's `In [n]`, or null if unknown. */
  executionCount: number | null;
  /** The turn's id; with `index` (its proposals counted from 0) it names the message. */
  turn: string;
  index: number;
}

/** The kernel's `set_next_input` text for a Markdown proposal starts so (a code cell). */
export const MARKDOWN_NEXT_INPUT_PREFIX = '%%markdown\n';

/**
 * The `set_next_input` text the kernel also sends at the end of the turn, had this been
 * its last proposal (`SessionHolder.place_proposed`): the source, or for Markdown the
 * source as a `%%markdown` code cell.
 */
export function nextInputText(proposal: IAddCell): string {
  return proposal.kind === 'code'
    ? proposal.source
    : MARKDOWN_NEXT_INPUT_PREFIX + proposal.source;
}

/** The proposed cell in a comm payload, or null when the payload is not one. */
export function parseAddCell(data: unknown): IAddCell | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const fields = data as Fields;
  const ok =
    fields.type === 'add_cell' &&
    isString(fields.source) &&
    (fields.kind === 'code' || fields.kind === 'markdown') &&
    (fields.cellId === null || fields.cellId === undefined || isString(fields.cellId)) &&
    (fields.executionCount === null ||
      fields.executionCount === undefined ||
      isInt(fields.executionCount)) &&
    isString(fields.turn) &&
    isInt(fields.index);
  if (!ok) {
    return null;
  }
  return {
    type: 'add_cell',
    source: fields.source as string,
    kind: fields.kind as CellKind,
    cellId: (fields.cellId as string | undefined) ?? null,
    executionCount: (fields.executionCount as number | undefined) ?? null,
    turn: fields.turn as string,
    index: fields.index as number
  };
}

/**
 * The data of a comm message on `context`'s iopub that answers a request of this page (its
 * `parent_header.session` is this page's kernel client), or null: another browser on the same
 * kernel did not run the cell, so proposals and edits are acted on only where it ran.
 */
export function ownCommData(context: ISessionContext, msg: KernelMessage.IMessage): unknown {
  if (msg.header.msg_type !== 'comm_msg') {
    return null;
  }
  const kernel = context.session?.kernel;
  const parent = msg.parent_header as Partial<KernelMessage.IHeader>;
  if (!kernel || parent.session !== kernel.clientId) {
    return null;
  }
  return (msg as KernelMessage.ICommMsgMsg).content.data;
}
