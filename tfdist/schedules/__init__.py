"""tfdist.schedules"""
