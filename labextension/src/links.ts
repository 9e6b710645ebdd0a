/**
 * Which DistModel belongs to which notebook: one model and one kernel channel per notebook panel,
 * re-attached when the panel's kernel changes; `current` follows the active notebook.
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';

import { KernelChannel } from './channel';
import { DistModel } from './model';

export interface ILink {
  panel: NotebookPanel;
  model: DistModel;
  channel: KernelChannel | null;
}

export class NotebookLinks {
  private _links = new Map<NotebookPanel, ILink>();
  private _currentChanged = new Signal<this, ILink | null>(this);

  constructor(private _tracker: INotebookTracker) {
    _tracker.forEach(panel => this._add(panel));
    // The tracker may make a panel current before announcing it: say so again once it is linked.
    _tracker.widgetAdded.connect((_, panel) => {
      this._add(panel);
      this._currentChanged.emit(this.current);
    });
    _tracker.currentChanged.connect(() =>
      this._currentChanged.emit(this.current)
    );
  }

  /** The link of the active notebook, if any. */
  get current(): ILink | null {
    const panel = this._tracker.currentWidget;
    return panel ? (this._links.get(panel) ?? null) : null;
  }

  get currentChanged(): ISignal<this, ILink | null> {
    return this._currentChanged;
  }

  private _add(panel: NotebookPanel): void {
    if (this._links.has(panel)) {
      return;
    }
    const link: ILink = { panel, model: new DistModel(), channel: null };
    this._links.set(panel, link);
    const attach = () => {
      link.channel?.dispose();
      link.channel = null;
      link.model.reset();
      const kernel = panel.sessionContext.session?.kernel;
      if (kernel) {
        link.channel = new KernelChannel(kernel, link.model);
        link.channel
          .probe()
          .catch(reason => console.warn('nbdist: probe failed', reason));
      }
    };
    panel.sessionContext.kernelChanged.connect(attach);
    attach();
    panel.disposed.connect(() => {
      link.channel?.dispose();
      this._links.delete(panel);
    });
  }
}
