/**
 * The two notebook cell commands: "Mark cell as model definition" and "Distribute this cell…".
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { parseDistributeLine, setDistributeLine, toggleDefinition } from './celltext';
import { NotebookLinks } from './links';
import { DEFAULT_STRATEGIES } from './model';

export const CommandIDs = {
  markDefinition: 'nbdist:mark-definition',
  distributeCell: 'nbdist:distribute-cell'
};

export function addCommands(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  links: NotebookLinks,
  palette: ICommandPalette | null
): void {
  const hasCodeCell = () => tracker.activeCell?.model.type === 'code';

  app.commands.addCommand(CommandIDs.markDefinition, {
    label: 'Mark cell as model definition',
    caption: 'Add or remove the `%%distribute define` line: the cell then runs here and on every engine',
    isEnabled: hasCodeCell,
    execute: () => {
      const cell = tracker.activeCell;
      if (cell && cell.model.type === 'code') {
        cell.model.sharedModel.setSource(toggleDefinition(cell.model.sharedModel.getSource()));
      }
    }
  });

  app.commands.addCommand(CommandIDs.distributeCell, {
    label: 'Distribute this cell…',
    caption: 'Choose a strategy and a number of workers; writes the `%%distribute` line',
    isEnabled: hasCodeCell,
    execute: async () => {
      const cell = tracker.activeCell;
      if (!cell || cell.model.type !== 'code') {
        return;
      }
      const source = cell.model.sharedModel.getSource();
      const strategies = links.current?.model.strategies ?? DEFAULT_STRATEGIES;
      const result = await showDialog({
        title: 'Distribute this cell',
        body: new DistributeForm(strategies, parseDistributeLine(source)),
        buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Distribute' })]
      });
      if (result.button.accept && result.value) {
        cell.model.sharedModel.setSource(
          setDistributeLine(source, result.value.strategy, result.value.workers)
        );
      }
    }
  });

  for (const command of [CommandIDs.markDefinition, CommandIDs.distributeCell]) {
    palette?.addItem({ command, category: 'nbdist' });
  }
  app.contextMenu.addItem({ type: 'separator', selector: '.jp-Notebook .jp-CodeCell', rank: 20 });
  app.contextMenu.addItem({ command: CommandIDs.markDefinition, selector: '.jp-Notebook .jp-CodeCell', rank: 21 });
  app.contextMenu.addItem({ command: CommandIDs.distributeCell, selector: '.jp-Notebook .jp-CodeCell', rank: 22 });
}

interface IDistributeChoice {
  strategy: string;
  workers: number | null;
}

/** The dialog body: a strategy and a number of workers (empty: the strategy's default). */
class DistributeForm extends Widget implements Dialog.IBodyWidget<IDistributeChoice> {
  private _strategy: HTMLSelectElement;
  private _workers: HTMLInputElement;

  constructor(strategies: string[], current: { strategy: string | null; workers: number | null }) {
    super();
    this.addClass('jp-nbdist-form');
    this._strategy = document.createElement('select');
    this._strategy.className = 'jp-mod-styled jp-nbdist-form-strategy';
    for (const name of strategies) {
      this._strategy.appendChild(new Option(name, name, false, name === (current.strategy ?? 'local')));
    }
    this._workers = document.createElement('input');
    this._workers.type = 'number';
    this._workers.min = '1';
    this._workers.placeholder = 'all idle engines';
    this._workers.className = 'jp-mod-styled jp-nbdist-form-workers';
    if (current.workers !== null) {
      this._workers.value = String(current.workers);
    }
    this.node.append(label('Strategy', this._strategy), label('Workers', this._workers));
  }

  getValue(): IDistributeChoice {
    const workers = parseInt(this._workers.value, 10);
    return {
      strategy: this._strategy.value,
      workers: Number.isInteger(workers) && workers > 0 ? workers : null
    };
  }
}

function label(text: string, control: HTMLElement): HTMLLabelElement {
  const element = document.createElement('label');
  element.append(text, control);
  return element;
}
