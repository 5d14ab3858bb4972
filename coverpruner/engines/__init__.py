"""coverpruner.engines"""
