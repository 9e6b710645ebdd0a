/**
 * One kernel's comm with nbdist: find or accept the comm, feed its messages to a DistModel, send actions.
 *
 * The kernel opens a comm to target `nbdist` when `%load_ext nbdist` runs (we register the target
 * to accept it); when we connect to a kernel that already has nbdist loaded (a page reload), its
 * comm_info lists that target and we open a comm of our own. Nothing is polled: the kernel pushes.
 */
import type { Kernel, KernelMessage } from '@jupyterlab/services';

import { DistModel } from './model';
import { Action, COMM_TARGET } from './protocol';

/** The part of a kernel connection the channel uses (a fake in unit tests). */
export type IKernelLike = Pick<
  Kernel.IKernelConnection,
  | 'registerCommTarget'
  | 'removeCommTarget'
  | 'requestCommInfo'
  | 'createComm'
  | 'statusChanged'
  | 'connectionStatusChanged'
  | 'isDisposed'
>;

export class KernelChannel {
  /** JupyterLab's theme, once the plugin knows it: every kernel's dashboards follow it. */
  private static _dark: boolean | null = null;
  private static _open = new Set<KernelChannel>();

  /** Tell every connected kernel (and those that connect later) whether the theme is dark. */
  static setTheme(dark: boolean): void {
    KernelChannel._dark = dark;
    KernelChannel._open.forEach(channel => channel._sendTheme());
  }

  private _comm: Kernel.IComm | null = null;
  private _probing: Promise<void> | null = null;
  private _disposed = false;

  constructor(
    readonly kernel: IKernelLike,
    readonly model: DistModel
  ) {
    this._onOpen = this._onOpen.bind(this);
    kernel.registerCommTarget(COMM_TARGET, this._onOpen);
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.connectionStatusChanged.connect(this._onConnection, this);
  }

  get connected(): boolean {
    return this._comm !== null;
  }

  /** Ask the kernel whether nbdist is loaded; if it is, open a comm and ask for the state. */
  probe(): Promise<void> {
    if (!this._probing) {
      this._probing = this._probe().finally(() => {
        this._probing = null;
      });
    }
    return this._probing;
  }

  private async _probe(): Promise<void> {
    if (this._disposed || this._comm) {
      return;
    }
    const reply = await this.kernel.requestCommInfo({
      target_name: COMM_TARGET
    });
    const content = reply.content;
    if (
      this._disposed ||
      this._comm ||
      content.status !== 'ok' ||
      Object.keys(content.comms).length === 0
    ) {
      return;
    }
    const comm = this.kernel.createComm(COMM_TARGET);
    this._adopt(comm);
    comm.open({ action: 'request_state' });
    this._sendTheme();
  }

  /** Send an action to the kernel; false when no comm is open. */
  send(action: Action): boolean {
    if (!this._comm || this._comm.isDisposed) {
      return false;
    }
    this._comm.send(action as unknown as Record<string, never>);
    return true;
  }

  stop(run: number): boolean {
    return this.send({ action: 'stop', run });
  }

  showDashboard(run: number): boolean {
    return this.send({ action: 'show_dashboard', run });
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    KernelChannel._open.delete(this);
    this.kernel.statusChanged.disconnect(this._onStatus, this);
    this.kernel.connectionStatusChanged.disconnect(this._onConnection, this);
    if (!this.kernel.isDisposed) {
      this.kernel.removeCommTarget(COMM_TARGET, this._onOpen);
    }
    this._comm = null;
  }

  /** The kernel opened a comm (`%load_ext nbdist` just ran): use it, ask for the state. */
  private _onOpen(comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg): void {
    this._adopt(comm);
    this.model.handle(msg.content.data);
    comm.send({ action: 'request_state' });
    this._sendTheme();
  }

  private _sendTheme(): void {
    if (KernelChannel._dark !== null) {
      this.send({ action: 'theme', dark: KernelChannel._dark });
    }
  }

  private _adopt(comm: Kernel.IComm): void {
    this._comm = comm;
    KernelChannel._open.add(this);
    comm.onMsg = msg => {
      this.model.handle(msg.content.data);
    };
    comm.onClose = () => {
      if (this._comm === comm) {
        this._comm = null;
        this.model.reset(); // `%unload_ext nbdist`, or the kernel went away
      }
    };
  }

  private _onStatus(_: unknown, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._comm = null;
      this.model.reset();
    }
  }

  private _onConnection(_: unknown, status: Kernel.ConnectionStatus): void {
    if (status === 'connected') {
      this.probe().catch(reason => console.warn('nbdist: probe failed', reason));
    }
  }
}
