"""Graph hypernetworks (LoGAH) that predict parameters from an ArchGraph; arrives with issue #5."""
