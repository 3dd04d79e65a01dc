"""trainsim.simulate"""
