"""trainsim.models"""
