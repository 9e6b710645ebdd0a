/**
 * The messages between the kernel (nbdist/notebook/lab_comm.py) and the sidebar, and their validation.
 *
 * Node records follow DESIGN.md section 8 (run, worker, host, step, epoch, t, loss, ...).
 */

/** The comm target the kernel registers on `%load_ext nbdist`; the front end registers it too. */
export const COMM_TARGET = 'nbdist';
export const SCHEMA_VERSION = 1;

export type EngineState = 'idle' | 'busy' | 'dead';
export type RunStatus =
  | 'pending'
  | 'running'
  | 'done'
  | 'failed'
  | 'interrupted';

export interface IEngine {
  id: number;
  host: string;
  pid: number | null;
  cpus: number | null;
  gpus: string[];
  state: EngineState;
}

export interface ICluster {
  owned: boolean;
  engines: IEngine[];
}

export interface IDefinition {
  key: string;
  index: number;
  digest: string;
  first_line: string;
  lines: number;
}

/** One metrics record (DESIGN.md section 8); fields not measured are null. */
export interface IRecord {
  run?: number | string | null;
  worker?: number | null;
  host?: string | null;
  step?: number | null;
  epoch?: number | null;
  t?: number | null;
  loss?: number | null;
  samples?: number | null;
  samples_per_s?: number | null;
  staleness?: number | null;
  gamma?: number | null;
  lr?: number | null;
  phase?: string | null;
  bytes_sent?: number | null;
  comm_s?: number | null;
  compute_s?: number | null;
  [field: string]: unknown;
}

export interface INode {
  rank: number;
  engine: number;
  host: string | null;
  gpus: string[];
  record: IRecord | null;
  losses: number[];
}

export interface IRun {
  id: number;
  strategy: string;
  status: RunStatus;
  workers: number[];
  cell_id: string | null;
  started_at: number | null;
  ended_at: number | null;
  progress: number | null;
  error: string | null;
  nodes: INode[];
  stoppable: boolean;
  final: Record<string, number | null>;
  /** What happened besides training (deaths, recoveries, engines that joined), one sentence each. */
  events: string[];
}

export interface IStateMessage {
  type: 'state';
  schema: number;
  kernel_time: number;
  strategies: string[];
  cluster: ICluster | null;
  definitions: IDefinition[];
  runs: IRun[];
}

export interface IHelloMessage {
  type: 'hello';
  schema: number;
}

export interface IAckMessage {
  type: 'ack';
  action: string;
  run: number | null;
  ok: boolean;
  message: string;
}

export interface IDashboardMessage {
  type: 'dashboard';
  run: number;
  model_id: string | null;
  cell_id: string | null;
  message: string;
}

export type KernelMessage =
  | IStateMessage
  | IHelloMessage
  | IAckMessage
  | IDashboardMessage;

/** What the front end asks of the kernel. */
export type Action =
  | { action: 'request_state' }
  | { action: 'stop'; run: number }
  | { action: 'show_dashboard'; run: number }
  | { action: 'theme'; dark: boolean };

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The kernel message in `data`, or null for anything malformed or of another schema version
 * (an older or newer nbdist in the kernel than in JupyterLab).
 */
export function parseMessage(data: unknown): KernelMessage | null {
  if (!isObject(data) || typeof data.type !== 'string') {
    return null;
  }
  switch (data.type) {
    case 'state':
      if (
        data.schema !== SCHEMA_VERSION ||
        !Array.isArray(data.runs) ||
        !Array.isArray(data.definitions) ||
        !(data.cluster === null || isObject(data.cluster))
      ) {
        return null;
      }
      return {
        strategies: [],
        kernel_time: Date.now() / 1000,
        ...data
      } as unknown as IStateMessage;
    case 'hello':
      return data.schema === SCHEMA_VERSION
        ? (data as unknown as IHelloMessage)
        : null;
    case 'ack':
      return typeof data.ok === 'boolean'
        ? (data as unknown as IAckMessage)
        : null;
    case 'dashboard':
      return typeof data.run === 'number'
        ? (data as unknown as IDashboardMessage)
        : null;
    default:
      return null;
  }
}
