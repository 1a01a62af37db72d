"""Offline pipeline: public corpus -> G embeddings -> k-means -> H -> F, V -> classifiers -> p per
epsilon -> a versioned BentoML model. Entry point: ``sentdp-train`` (:mod:`training.cli`).

Modules, roughly in dependency order:

* :mod:`training.settings` - cache folder, device and threads from ``SENTDP_*`` variables.
* :mod:`training.datasets`, :mod:`training.corpora` - public corpora and user files; splits.
* :mod:`training.embeddings` - sentence embeddings of a corpus, cached.
* :mod:`training.nets`, :mod:`training.fitting` - torch MLPs and the one training loop.
* :mod:`training.recoder`, :mod:`training.label_recoder`, :mod:`training.classifiers` - H, the
  label-tuned H, and the classifiers.
* :mod:`training.candidates`, :mod:`training.variants` - F and V; one mechanism variant.
* :mod:`training.p_selection` - the (variant, p) per epsilon, chosen on validation.
* :mod:`training.pipeline`, :mod:`training.store`, :mod:`training.cli` - the whole run.

Evaluation of trained bundles lives in the ``evaluation`` package, which builds on this one.
"""
