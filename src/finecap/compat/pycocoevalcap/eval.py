"""pycocoevalcap's ``eval`` module: ``COCOEvalCap`` (finecap's, :mod:`finecap.metrics.cocoeval`) and the names
pycocoevalcap's ``eval`` imports (``from pycocoevalcap.eval import COCOEvalCap, Bleu, Meteor, Rouge, Cider, Spice``
is how lmms-eval imports them)."""

from finecap.compat.pycocoevalcap.bleu.bleu import Bleu
from finecap.compat.pycocoevalcap.cider.cider import Cider
from finecap.compat.pycocoevalcap.meteor.meteor import Meteor
from finecap.compat.pycocoevalcap.rouge.rouge import Rouge
from finecap.compat.pycocoevalcap.spice.spice import Spice
from finecap.compat.pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
from finecap.metrics.cocoeval import COCOEvalCap

__all__ = ["COCOEvalCap", "Bleu", "Cider", "Meteor", "PTBTokenizer", "Rouge", "Spice"]
