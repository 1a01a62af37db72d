"""sentdp: sentence-level differentially private document embeddings (DeepCandidate).

Modules, in dependency order:

* :mod:`sentdp.errors` - the errors sentdp raises, split by whose mistake they are.
* :mod:`sentdp.text` - documents to sentences (the privacy unit), with size limits.
* :mod:`sentdp.encoders` - the frozen sentence encoder G and the recoder H (exact MLPs).
* :mod:`sentdp.depth` - exact, fast approximate Tukey depth of candidates among sentences.
* :mod:`sentdp.sampling` - constant-randomness exact sampling with a uniform floor.
* :mod:`sentdp.mechanism` - DeepCandidate: utilities, log-probabilities, sampling.
* :mod:`sentdp.words` - a sentence's words as public TF-IDF features for SentenceVote.
* :mod:`sentdp.labels` - SentenceVote: a private label from per-sentence votes.
* :mod:`sentdp.accounting` - what a document costs and what a budget admits.
* :mod:`sentdp.bundle` - the versioned model bundle the service loads.

sentdp knows nothing of HTTP or BentoML; ``training`` and ``service`` build on it.
"""

__version__ = "0.1.0"
