"""stub"""
def snapshot(svc):
    return svc.op_stats({"detail": True})
def render(s):
    return "<html></html>"
