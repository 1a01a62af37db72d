"""Evaluation of trained bundles: the paper's experiments, its baselines and the reports.

Modules, in dependency order:

* :mod:`evaluation.baselines` - truncation and word-level metric DP, the paper's baselines.
* :mod:`evaluation.results` - what an evaluation found, typed, and its ``results.json`` form.
* :mod:`evaluation.experiment` - the epsilon and k sweeps on a bundle's test split.
* :mod:`evaluation.report` - results to ``report.md``, two plots and ``results.json``.
* :mod:`evaluation.cli` - ``sentdp-eval``.

Dependencies point one way: ``evaluation -> training -> sentdp``; nothing imports evaluation.
"""
