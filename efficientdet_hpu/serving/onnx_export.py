"""ONNX export of a trained detector's network (`python inference.py export --formats=onnx_fp32`).

  model_fp32.onnx   the same frozen network graph as model_fp32.tflite (serving/tflite_export.py
                    build_tflite_graph(spec, 'network')), converted by tf2onnx, opset 17
    input   images        float32 [1, h, w, 3]  preprocessed as for the TFLite file
    outputs class_logits  float32 [1, N, C]     anchor order (level, y, x, anchor)
            box_codes     float32 [1, N, 4]     [ty, tx, th, tw]

The network only: ONNX has no soft-NMS, so the post-processing runs with the project's own
code, the postprocess_fp32.tflite file every export writes (serving/onnx_runner.py). The file
also serves TensorRT and other ONNX runtimes as the network part.

tf2onnx is imported inside the functions: the rest of the project does not pay its import
time, and a missing package is an InferenceError naming the pip command.
"""
from efficientdet_hpu.core import tf_env
from efficientdet_hpu.serving import tflite_runner
from efficientdet_hpu.serving.formats import ONNX_FILES  # noqa: F401  (this module's name too)
from efficientdet_hpu.serving.model_spec import InferenceError

OPSET = 17  # Supported by onnxruntime 1.20 and TensorRT 8.6+.
PIP_COMMAND = 'pip install tf2onnx==1.17.0 onnx==1.17.0'


def import_tf2onnx():
    """(tf2onnx, onnx), or an InferenceError naming the pip command."""
    try:
        import tf2onnx  # pylint: disable=import-outside-toplevel
        import onnx  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise InferenceError('the onnx_fp32 export needs the tf2onnx and onnx packages (%s): '
                             '%s' % (error, PIP_COMMAND)) from error
    return tf2onnx, onnx


def convert_graph(graph, inputs, outputs):
    """The ONNX file's bytes of a frozen network graph (tflite_export.build_tflite_graph's
    'network' part: images -> class_logits, box_codes); graph names become ONNX names."""
    tf2onnx, onnx = import_tf2onnx()
    renames = {tensor.name: tensor.op.name for tensor in inputs + outputs}
    if sorted(renames.values()) != sorted(['images', tflite_runner.LOGITS, tflite_runner.CODES]):
        raise ValueError('not the network graph: %s' % sorted(renames.values()))
    with tf_env.quiet_native_output():
        model, _ = tf2onnx.convert.from_graph_def(
            graph.as_graph_def(), name='efficientdet', input_names=[t.name for t in inputs],
            output_names=[t.name for t in outputs], opset=OPSET, tensors_to_rename=renames)
    # tf2onnx leaves an op it cannot convert in place (continue_on_error): refuse such a file.
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise InferenceError('tf2onnx could not convert the network to ONNX opset %d: %s'
                             % (OPSET, str(error).splitlines()[0])) from error
    return model.SerializeToString()
