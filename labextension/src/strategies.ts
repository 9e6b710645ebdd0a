// Generated from nbdist's strategy registry by `python scripts/options_reference.py --strategies labextension/src/strategies.ts`; do not edit.

/** The strategies offered before a kernel has said which it knows. */
export const DEFAULT_STRATEGIES = [
  'local',
  'hfdt',
  'nfdt',
  'asgd',
  'dc-asgd',
  'dc-asgd-a',
  'dc-asgdk',
  'ddc-asgd',
  'ssgd',
  'adsp',
  'ashl',
  'pipeline',
  'tensor'
];
