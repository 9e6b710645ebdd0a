import {
  distributeLine,
  isDefinition,
  parseDistributeLine,
  setDistributeLine,
  toggleDefinition
} from '../celltext';

describe('Mark cell as model definition', () => {
  it('adds the define line, and removes it again', () => {
    const source = 'import keras\nx = 1';
    const marked = toggleDefinition(source);
    expect(marked).toBe('%%distribute define\nimport keras\nx = 1');
    expect(isDefinition(marked)).toBe(true);
    expect(toggleDefinition(marked)).toBe(source);
  });

  it('removes a define line with options', () => {
    expect(toggleDefinition('%%distribute define --name data\nx = 1')).toBe('x = 1');
  });

  it('replaces a training magic line instead of stacking two magics', () => {
    expect(toggleDefinition('%%distribute --strategy nfdt\nmodel.fit(x)')).toBe(
      '%%distribute define\nmodel.fit(x)'
    );
  });

  it('handles an empty cell', () => {
    expect(toggleDefinition('')).toBe('%%distribute define\n');
    expect(toggleDefinition('%%distribute define\n')).toBe('');
  });
});

describe('Distribute this cell', () => {
  it('writes the %%distribute line first', () => {
    expect(setDistributeLine('model.fit(x)', 'nfdt', 2)).toBe(
      '%%distribute --strategy nfdt --workers 2\nmodel.fit(x)'
    );
    expect(setDistributeLine('model.fit(x)', 'local', null)).toBe('%%distribute --strategy local\nmodel.fit(x)');
  });

  it('replaces an existing magic line (training or define)', () => {
    expect(setDistributeLine('%%distribute --strategy local\nfit()', 'ddc-asgd', 4)).toBe(
      '%%distribute --strategy ddc-asgd --workers 4\nfit()'
    );
    expect(setDistributeLine('%%distribute define\nfit()', 'hfdt', null)).toBe('%%distribute --strategy hfdt\nfit()');
  });

  it('refuses a strategy name that is not a plain word and a bad worker count', () => {
    expect(() => distributeLine('nfdt; rm -rf', 2)).toThrow('not a strategy name');
    expect(() => distributeLine('nfdt', 0)).toThrow('positive whole number');
    expect(() => distributeLine('nfdt', 1.5)).toThrow('positive whole number');
  });

  it('reads the options already on the line, to prefill the dialog', () => {
    expect(parseDistributeLine('%%distribute --strategy nfdt --workers 3\nfit()')).toEqual({
      strategy: 'nfdt',
      workers: 3
    });
    expect(parseDistributeLine('%%distribute --strategy=local\nfit()')).toEqual({ strategy: 'local', workers: null });
    expect(parseDistributeLine('%%distribute define\nx')).toEqual({ strategy: null, workers: null });
    expect(parseDistributeLine('fit()')).toEqual({ strategy: null, workers: null });
  });
});
