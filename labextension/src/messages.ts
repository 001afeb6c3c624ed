/**
 * The messages the kernel sends over the `soba_nb.monitor` comm
 * (their Python side is `soba_nb/notebook/comm.py`, which documents the same shapes).
 */

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
  lastResult: string | null;
  degraded: boolean;
  provider: string;
  session: string;
}

/** A compaction barrier is running: `Compacting context before response · NN%`. */
export interface IProgress {
  type: 'progress';
  percent: number;
  trigger: string;
}

/** A barrier finished: the live line collapses to this result line. */
export interface IResult {
  type: 'result';
  line: string;
  degraded: boolean;
}

export type MonitorMessage = ISnapshot | IProgress | IResult;

type Fields = Record<string, unknown>;

const isInt = (value: unknown): value is number => Number.isInteger(value);
const isString = (value: unknown): value is string => typeof value === 'string';
const isBool = (value: unknown): value is boolean => typeof value === 'boolean';

function parseSnapshot(data: Fields): ISnapshot | null {
  const ok =
    isInt(data.effective) &&
    isInt(data.hardLimit) &&
    isInt(data.softLimit) &&
    isString(data.source) &&
    isBool(data.auto) &&
    (data.lastResult === null || data.lastResult === undefined || isString(data.lastResult));
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
    degraded: data.degraded === true,
    provider: isString(data.provider) ? data.provider : '',
    session: isString(data.session) ? data.session : ''
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
      return isInt(fields.percent)
        ? {
            type: 'progress',
            percent: fields.percent,
            trigger: isString(fields.trigger) ? fields.trigger : ''
          }
        : null;
    case 'result':
      return isString(fields.line)
        ? { type: 'result', line: fields.line, degraded: fields.degraded === true }
        : null;
    default:
      return null;
  }
}
