"""coverpruner.export"""
