/**
 * Pure edits of a cell's source for the two cell commands.
 */

const DEFINE_LINE = '%%distribute define';
const MAGIC = /^%%distribute\b/;

/** Whether the cell's first line is `%%distribute define ...`. */
export function isDefinition(source: string): boolean {
  const first = source.split('\n', 1)[0].trim();
  return MAGIC.test(first) && first.split(/\s+/)[1] === 'define';
}

/**
 * "Mark cell as model definition": add the `%%distribute define` line, or remove it when present.
 * A training cell's `%%distribute ...` line is replaced rather than stacked.
 */
export function toggleDefinition(source: string): string {
  if (isDefinition(source)) {
    return dropMagicLine(source);
  }
  return `${DEFINE_LINE}\n${dropMagicLine(source)}`;
}

/** The `%%distribute` line for a training cell. */
export function distributeLine(strategy: string, workers: number | null): string {
  if (!/^[a-z0-9-]+$/.test(strategy)) {
    throw new Error(`not a strategy name: ${JSON.stringify(strategy)}`);
  }
  let line = `%%distribute --strategy ${strategy}`;
  if (workers !== null) {
    if (!Number.isInteger(workers) || workers < 1) {
      throw new Error(`workers must be a positive whole number, got ${workers}`);
    }
    line += ` --workers ${workers}`;
  }
  return line;
}

/** "Distribute this cell…": put the `%%distribute --strategy S --workers N` line first. */
export function setDistributeLine(
  source: string,
  strategy: string,
  workers: number | null
): string {
  return `${distributeLine(strategy, workers)}\n${dropMagicLine(source)}`;
}

/** The options already on a training cell's magic line (to prefill the dialog). */
export function parseDistributeLine(source: string): {
  strategy: string | null;
  workers: number | null;
} {
  const first = source.split('\n', 1)[0].trim();
  if (!MAGIC.test(first) || isDefinition(source)) {
    return { strategy: null, workers: null };
  }
  const strategy = /--strategy[=\s]+([a-z0-9-]+)/.exec(first);
  const workers = /--workers[=\s]+(\d+)/.exec(first);
  return {
    strategy: strategy ? strategy[1] : null,
    workers: workers ? parseInt(workers[1], 10) : null
  };
}

function dropMagicLine(source: string): string {
  const lines = source.split('\n');
  return MAGIC.test(lines[0].trim()) ? lines.slice(1).join('\n') : source;
}
