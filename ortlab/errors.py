"""The errors ortlab raises on purpose.

Every message says what is wrong and what to do about it, so that a learner
never has to read a traceback from deep inside numpy or onnx to find out.
"""


class OrtlabError(Exception):
    """Base of every error ortlab raises on purpose."""
