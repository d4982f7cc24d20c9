"""Running the ONNX export's network (serving/onnx_export.py) with onnxruntime.

model_fp32.onnx is the network only: images float32 [1, h, w, 3] preprocessed ->
class_logits [1, N, C], box_codes [1, N, 4]. ONNX has no soft-NMS, so ONNXPredictor runs the
rest as TFLitePredictor does (tflite_runner.ExportPredictor): the eval preprocessing before
the network, the export's postprocess_fp32.tflite file (the config's decode and NMS) after it,
then boxes scaled to the image, clipped and labels mapped to category ids on the host. So
`predict` takes and returns what SavedModelPredictor does.

The session runs on the CPUExecutionProvider with every core (intra_op_num_threads =
os.cpu_count()). onnxruntime is imported when a predictor is made: the rest of the project
does not pay its import time, and a missing package is an InferenceError naming pip's command.
"""
import os

from efficientdet_hpu.serving import tflite_runner
from efficientdet_hpu.serving.model_spec import InferenceError

PIP_COMMAND = 'pip install onnxruntime==1.20.1'


def import_onnxruntime():
    """The onnxruntime module, or an InferenceError naming the pip command."""
    try:
        import onnxruntime  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise InferenceError('running an ONNX export needs the onnxruntime package (%s): %s'
                             % (error, PIP_COMMAND)) from error
    return onnxruntime


def make_session(model_path=None, model_content=None, num_threads=None):
    """An onnxruntime.InferenceSession over a file or bytes, on the CPU, every core."""
    onnxruntime = import_onnxruntime()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = num_threads or os.cpu_count()
    options.log_severity_level = 3  # Errors only: its graph-optimiser notices are not ours.
    errors = onnxruntime.capi.onnxruntime_pybind11_state  # Its exception classes.
    try:
        return onnxruntime.InferenceSession(
            model_path if model_content is None else model_content, options,
            providers=['CPUExecutionProvider'])
    except (errors.InvalidProtobuf, errors.InvalidGraph, errors.Fail,
            errors.NoSuchFile) as error:
        raise InferenceError('%s is not an ONNX model onnxruntime can run (%s)'
                             % (model_path or 'the model', str(error).splitlines()[0])) from error


class ONNXPredictor(tflite_runner.ExportPredictor):
    """An ONNX export: the network in onnxruntime, then the post-processing file in
    tf.lite.Interpreter; `predict(images)` -> {OUTPUT_KEYS: numpy}, as SavedModelPredictor."""
    FLAG = '--onnx'
    FORMAT = 'onnx_fp32'

    def __init__(self, model_path=None, metadata=None, model_content=None,
                 postprocess_content=None, num_threads=None):
        super().__init__(model_path, metadata, postprocess_content, num_threads)
        self._session = make_session(model_path, model_content, num_threads)
        (self._input,) = [item.name for item in self._session.get_inputs()]
        self._output_names = [tflite_runner.LOGITS, tflite_runner.CODES]

    def network_outputs(self, network_image):
        values = self._session.run(self._output_names, {self._input: network_image})
        return dict(zip(self._output_names, values))

    def close(self):
        super().close()
        self._session = None
