"""Tools: the ``@tool`` decorator and its specs, the registry, secret arguments."""
