"""trainsim.transform"""
