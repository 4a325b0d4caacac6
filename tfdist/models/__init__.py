"""tfdist.models"""
