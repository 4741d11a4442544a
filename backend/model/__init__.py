"""Loading a model and reaching into it: the adapter table, the loaded model, its hook sites."""
