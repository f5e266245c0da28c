"""Example tools modules, as a user of Saga Store would write them."""
