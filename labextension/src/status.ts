/**
 * The status-bar item: `nbdist: 4 engines · ddc-asgd 37%` for the active notebook's kernel.
 */
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { ILink, NotebookLinks } from './links';
import { DistModel } from './model';

export class DistStatus extends Widget {
  /** Emitted when the item should appear or disappear (nbdist loaded or not). */
  readonly activeStateChanged = new Signal<this, void>(this);
  private _model: DistModel | null = null;

  constructor(links: NotebookLinks) {
    super();
    this.addClass('jp-nbdist-status');
    this.node.title = 'nbdist: engines and the current run (open the Distributed sidebar for more)';
    links.currentChanged.connect((_, link) => this._follow(link));
    this._follow(links.current);
  }

  get active(): boolean {
    return this._model?.loaded ?? false;
  }

  private _follow(link: ILink | null): void {
    this._model?.changed.disconnect(this._refresh, this);
    this._model = link?.model ?? null;
    this._model?.changed.connect(this._refresh, this);
    this._refresh();
  }

  private _refresh(): void {
    this.node.textContent = this._model?.statusText() ?? '';
    this.activeStateChanged.emit();
  }
}
