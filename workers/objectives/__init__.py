"""Pure loss math: policy loss, KL, entropy, floors, the probability floor, the RV filter."""
