"""trainsim.plan"""
