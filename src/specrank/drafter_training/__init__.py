"""Training EAGLE-3-format drafter heads by self-distillation from the target."""
