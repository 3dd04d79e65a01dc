"""trainsim.run"""
