"""Offline pipeline: public corpus -> G embeddings -> k-means -> H -> F, V -> classifiers -> p per
epsilon -> a versioned BentoML model. Entry point: ``sentdp-train`` (:mod:`training.cli`)."""
