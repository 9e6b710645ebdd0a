/**
 * The sidebar's state for one kernel: what the kernel last pushed, plus the last answer to an action.
 */
import { ISignal, Signal } from '@lumino/signaling';

import {
  IAckMessage,
  IDashboardMessage,
  IRun,
  IStateMessage,
  KernelMessage,
  parseMessage
} from './protocol';
import { DEFAULT_STRATEGIES } from './strategies';

export { DEFAULT_STRATEGIES };

export class DistModel {
  private _state: IStateMessage | null = null;
  private _loaded = false;
  private _notice: IAckMessage | null = null;
  private _changed = new Signal<this, void>(this);
  private _dashboardRequested = new Signal<this, IDashboardMessage>(this);

  /** Emitted whenever anything shown may have changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted with the kernel's answer to "show dashboard". */
  get dashboardRequested(): ISignal<this, IDashboardMessage> {
    return this._dashboardRequested;
  }

  /** Whether nbdist is loaded in the kernel (a comm answered). */
  get loaded(): boolean {
    return this._loaded;
  }

  get state(): IStateMessage | null {
    return this._state;
  }

  /** The last acknowledgement of an action (shown under the runs). */
  get notice(): IAckMessage | null {
    return this._notice;
  }

  get strategies(): string[] {
    const known = this._state?.strategies;
    return known && known.length ? known : DEFAULT_STRATEGIES;
  }

  get engineCount(): number {
    return (this._state?.cluster?.engines ?? []).filter(e => e.state !== 'dead')
      .length;
  }

  /** The run the status bar talks about: the newest running one, else the newest. */
  get currentRun(): IRun | null {
    const runs = this._state?.runs ?? [];
    const running = runs.filter(r => r.status === 'running');
    const pick = running.length ? running : runs;
    return pick.length ? pick[pick.length - 1] : null;
  }

  /** Take one message from the kernel; returns false (and changes nothing) when it is malformed. */
  handle(data: unknown): boolean {
    const message: KernelMessage | null = parseMessage(data);
    if (message === null) {
      return false;
    }
    switch (message.type) {
      case 'hello':
        this._loaded = true;
        break;
      case 'state':
        this._loaded = true;
        this._state = message;
        break;
      case 'ack':
        this._notice = message;
        break;
      case 'dashboard':
        if (message.message) {
          this._notice = {
            type: 'ack',
            action: 'show_dashboard',
            run: message.run,
            ok: false,
            message: message.message
          };
        }
        this._dashboardRequested.emit(message);
        break;
    }
    this._changed.emit();
    return true;
  }

  /** Forget everything: the kernel restarted, died, or nbdist was unloaded. */
  reset(): void {
    this._state = null;
    this._loaded = false;
    this._notice = null;
    this._changed.emit();
  }

  /** The status bar's text, e.g. `nbdist: 4 engines · ddc-asgd 37%`; empty when nbdist is not loaded. */
  statusText(): string {
    if (!this._loaded) {
      return '';
    }
    if (!this._state?.cluster) {
      return 'nbdist: no cluster';
    }
    const n = this.engineCount;
    let text = `nbdist: ${n} engine${n === 1 ? '' : 's'}`;
    const run = this.currentRun;
    if (run) {
      text += ` · ${run.strategy} ${runProgressText(run)}`;
    }
    return text;
  }
}

/** "37%" while running (or "starting"), else the run's status. */
export function runProgressText(run: IRun): string {
  if (run.status === 'running' || run.status === 'pending') {
    return run.progress === null
      ? 'starting'
      : `${Math.floor(run.progress * 100)}%`;
  }
  return run.status;
}

/** Seconds a run has taken (until now, by the kernel's clock, while it runs). */
export function runSeconds(run: IRun, kernelTime: number): number | null {
  if (run.started_at === null) {
    return null;
  }
  return Math.max(0, (run.ended_at ?? kernelTime) - run.started_at);
}
