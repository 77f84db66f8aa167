"""The bounds the sections share: upper bounds of the options that size memory or work, and the image budget."""

# Upper bounds of the options that size memory or work. Generous (no real run comes near them) but finite, so that a
# typo (data.max_tokens=1e9 would allocate 512 GB) or a tampered stored config.yaml (decode.beam_size: 100000) is
# refused when the configuration is read, naming the key, instead of exhausting memory or running for ever.
MAX_TOKENS = 4096  # tokens of a caption: the longest dense VLM captions (DCI, DOCCI) are ~1,000; GPT-2 reads 1,024
MAX_BATCH = 65_536  # examples of one batch: twice the largest contrastive batch in use (CLIP's 32,768)
MAX_SPLIT = 1_000_000  # scenes of a world split: COCO has 123k images
MAX_PROCESSES = 256  # worker processes or threads started at once: the cores of a large two-socket machine
MAX_BAG = 1024  # images in a bag: TrueMatch and BagCurri use 3 to 7
MAX_REWARD_WEIGHT = 1e6  # |w| of a reward weight: the papers' are 0.5 to 1; a weight scales its reward as lr a step
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal number: a nonzero weight below it is 0 there
MAX_TINY_LAYERS, MAX_TINY_HIDDEN = 48, 2048  # world-tiny models: GPT-2 XL (48 layers, 1,600 wide) is not tiny
MAX_DECODE_POSITIONS = 2**26  # token positions of one decoding batch (rows x length): 67M, ~TBs of KV cache
PIL_MAX_IMAGE_PIXELS = 89_478_485  # PIL's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS): PIL refuses more

# The image budget (data.max_image_pixels, data.max_aspect_ratio), checked from an image's header before it is
# decoded (finecap.data.images.ImageLimits); the defaults admit every photograph of a camera or phone in its
# default mode. Pixels: 64 MP holds every full-frame camera's (the largest, 61 MP: 9504 x 6336) and phones' (12-50
# MP); a decoded image takes 3 bytes a pixel (192 MB at the limit), held per image of a batch until the image
# processor resizes it. Aspect ratio: 20:1 holds panoramas (a phone's are up to about 8:1); an image processor
# resizes the shorter side to a few hundred pixels, so a 1 x 60,000 strip, 320 bytes as a PNG, would become
# 224 x 13 million pixels (gigabytes).
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
DEFAULT_MAX_ASPECT_RATIO = 20.0
