"""pycocoevalcap 1.2's scorer classes on finecap's metrics: the same module paths, constructors,
``compute_score(gts, res)`` inputs and outputs and ``method()`` names, with pycocoevalcap's numbers.

======================================================  ==========================================================
module (``finecap.compat.pycocoevalcap.`` + ...)        computed by
======================================================  ==========================================================
``bleu.bleu.Bleu(n=4)``                                 :mod:`finecap.metrics.ngram` (BLEU, pycocoevalcap's
                                                        "closest" reference length)
``meteor.meteor.Meteor()``                              :mod:`finecap.metrics.meteor` (Python, no Java; reads
                                                        pycocoevalcap's data)
``rouge.rouge.Rouge()``                                 :mod:`finecap.metrics.ngram` (ROUGE-L)
``cider.cider.Cider(n=4, sigma=6.0)``                   :mod:`finecap.metrics.ngram` (CIDEr-D)
``spice.spice.Spice()``                                 :mod:`finecap.metrics.spice` (pycocoevalcap's jars, Java)
``tokenizer.ptbtokenizer.PTBTokenizer()``               :mod:`finecap.metrics.ptb_tokenize` (Python, no Java)
``eval.COCOEvalCap(coco, cocoRes)``                     :class:`finecap.metrics.cocoeval.COCOEvalCap`
======================================================  ==========================================================

``gts`` maps each id to a list of (tokenised) reference strings, ``res`` each id to a list of one (tokenised)
caption; both have the same ids, and scores follow the order of ``gts`` (SPICE: sorted ids, as pycocoevalcap). What
each ``compute_score`` returns, as pycocoevalcap returns it:

- ``Bleu(n)``: ``([BLEU-1 .. BLEU-n] floats, [[per-item BLEU-k floats] for k in 1..n])`` (lists);
- ``Meteor()``: ``(float, [per-item floats])``;
- ``Rouge()``, ``Cider()``: ``(numpy float64 mean, numpy array of per-item scores)``;
- ``Spice()``: ``(numpy float64 mean F-score, [per-item {category: {"pr", "re", "f", ...}}])``.

The numbers are pycocoevalcap's, bit for bit for BLEU, METEOR, ROUGE-L and CIDEr-D (tested with ``==`` against
pycocoevalcap itself), and the tokenizer's output is its Java tokenizer's on caption text
(:mod:`finecap.metrics.ptb_tokenize` lists the rare differences). Differences, on purpose:

- Nothing is printed (pycocoevalcap's ``Bleu`` prints its counts; ``verbose`` is accepted and ignored) and no Java
  process is started but SPICE's.
- Bad input raises ``ValueError`` naming the id (pycocoevalcap asserts, with a bare ``AssertionError``).
- ``Meteor()`` and ``Spice()`` raise :class:`~finecap.metrics.meteor.MetricUnavailable` (a ``RuntimeError``) with one
  line saying what is missing (pycocoevalcap's data; Java or SPICE's Stanford CoreNLP jars) when they are built;
  pycocoevalcap's ``Spice()`` would download the jars instead.
- ``COCOEvalCap`` is finecap's (:mod:`finecap.metrics.cocoeval` lists its few differences: SPICE's per-image entry is
  its F-score; a metric that cannot run is skipped with a warning).

The fast path: pycocoevalcap users tokenise once per metric (lmms-eval runs the Java tokenizer, a JVM each time,
before each of its 7 metrics). Here tokenising is cheap, but it is still the largest share of a scorer's time:
tokenise once and give the same ``gts`` / ``res`` to every scorer::

    from finecap.compat.pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    from finecap.compat.pycocoevalcap.bleu.bleu import Bleu
    from finecap.compat.pycocoevalcap.cider.cider import Cider

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": c} for c in refs[i]] for i in refs})
    res = tokenizer.tokenize({i: [{"caption": preds[i]}] for i in preds})
    bleu, _ = Bleu(4).compute_score(gts, res)
    cider, _ = Cider().compute_score(gts, res)

(or :class:`~finecap.metrics.cocoeval.COCOEvalCap`, or :func:`finecap.evaluate`, which tokenise once and share the
n-gram index between BLEU, ROUGE-L and CIDEr-D). :func:`finecap.compat.install` makes unmodified code that imports
pycocoevalcap use these classes.
"""
