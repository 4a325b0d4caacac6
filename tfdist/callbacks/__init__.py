"""tfdist.callbacks"""
