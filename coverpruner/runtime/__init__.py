"""coverpruner.runtime"""
