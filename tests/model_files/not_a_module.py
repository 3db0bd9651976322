model = "a string, not a module"
