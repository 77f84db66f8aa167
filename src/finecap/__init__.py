"""finecap: train and evaluate image captioners that say more than maximum-likelihood captions do."""

__version__ = "0.1.0"
