"""trainsim.capture"""
