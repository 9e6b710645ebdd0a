/** Test data: kernel messages as nbdist/notebook/lab_state.py sends them, and a fake kernel connection. */
import type { Kernel } from '@jupyterlab/services';
import { Signal } from '@lumino/signaling';

import { IRun, IStateMessage } from '../protocol';

export function run(overrides: Partial<IRun> = {}): IRun {
  return {
    id: 1,
    strategy: 'nfdt',
    status: 'running',
    workers: [0, 1],
    cell_id: 'cell-a',
    started_at: 100,
    ended_at: null,
    progress: 0.37,
    error: null,
    nodes: [
      {
        rank: 0,
        engine: 0,
        host: 'h',
        gpus: [],
        record: { run: 1, worker: 0, step: 10, epoch: 0, t: 101, loss: 1.5, samples_per_s: 900 },
        losses: [2, 1.5]
      }
    ],
    stoppable: true,
    final: {},
    events: [],
    ...overrides
  };
}

export function state(overrides: Partial<IStateMessage> = {}): IStateMessage {
  return {
    type: 'state',
    schema: 1,
    kernel_time: 110,
    strategies: ['local', 'nfdt', 'ddc-asgd'],
    cluster: {
      owned: true,
      engines: [
        { id: 0, host: 'h', pid: 1, cpus: 2, gpus: [], state: 'busy' },
        { id: 1, host: 'h', pid: 2, cpus: 2, gpus: ['GPU:0'], state: 'idle' },
        { id: 2, host: 'h', pid: 3, cpus: 2, gpus: [], state: 'dead' }
      ]
    },
    definitions: [{ key: 'data', index: 1, digest: 'abc', first_line: 'import keras', lines: 4 }],
    runs: [run()],
    ...overrides
  };
}

/** A comm that records what the channel sends; `receive` plays a message from the kernel. */
export class FakeComm {
  sent: unknown[] = [];
  opened: unknown[] = [];
  isDisposed = false;
  onMsg: (msg: any) => void = () => undefined;
  onClose: (msg: any) => void = () => undefined;

  constructor(readonly targetName: string, readonly commId: string) {}

  open(data: unknown) {
    this.opened.push(data);
  }

  send(data: unknown) {
    this.sent.push(data);
  }

  receive(data: unknown) {
    this.onMsg({ content: { comm_id: this.commId, data } });
  }

  closeFromKernel() {
    this.isDisposed = true;
    this.onClose({ content: { comm_id: this.commId, data: {} } });
  }
}

/** The kernel-connection surface KernelChannel uses; `comms` answers comm_info requests. */
export class FakeKernel {
  statusChanged = new Signal<this, Kernel.Status>(this);
  connectionStatusChanged = new Signal<this, Kernel.ConnectionStatus>(this);
  isDisposed = false;
  targets = new Map<string, (comm: any, msg: any) => void>();
  comms: Record<string, { target_name: string }> = {};
  created: FakeComm[] = [];

  registerCommTarget(name: string, callback: (comm: any, msg: any) => void) {
    this.targets.set(name, callback);
  }

  removeCommTarget(name: string, callback: (comm: any, msg: any) => void) {
    if (this.targets.get(name) === callback) {
      this.targets.delete(name);
    }
  }

  async requestCommInfo(content: { target_name?: string }) {
    return { content: { status: 'ok', comms: this.comms } } as any;
  }

  createComm(target: string) {
    const comm = new FakeComm(target, `front-${this.created.length}`);
    this.created.push(comm);
    return comm as any;
  }

  /** The kernel opens a comm to `target` (what `%load_ext nbdist` does). */
  openFromKernel(target: string, data: unknown): FakeComm {
    const comm = new FakeComm(target, 'kernel-0');
    const callback = this.targets.get(target);
    if (!callback) {
      throw new Error(`no target ${target}`);
    }
    callback(comm, { content: { comm_id: comm.commId, target_name: target, data } });
    return comm;
  }
}
