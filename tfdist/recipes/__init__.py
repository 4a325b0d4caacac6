"""tfdist.recipes"""
