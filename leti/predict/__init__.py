"""leti.predict"""
