"""tfdist.training"""
