"""leti.engine"""
