"""How the small committed ViT backbones were pretrained, and the paper-shaped stand-ins."""
