"""coverpruner.families"""
