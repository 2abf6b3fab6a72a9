"""Frontend: Python source -> FunctionAST (parse.py)."""
