"""leti.device"""
