"""tfdist.data"""
